"""Retry by failure class (docs/architecture.md), and the one attempt loop that applies it.

| failure                      | read                     | write                              |
| rate limited (429)           | up to 3, backoff, R-A    | same (an answer: nothing applied)  |
| could not connect (not sent) | up to 2                  | same (provably nothing sent)       |
| provider 5xx                 | up to 2                  | unknown outcome (see below)        |
| timeout, transport, crash    | once                     | unknown outcome                    |
| 409 request in progress      | up to 5, backoff         | wait, then status check / same key |
| no time left (deadline)      | never: not called        | never: not called, not applied     |
| invalid arguments / schema   | never here: fed back to the model once                        |
| refusal, policy block        | never                                                         |
| business error               | never: it is the tool's answer                                |

A write's unknown outcome is resolved with the same key: the tool's status check
if it has one (``not_found`` -> call again, charged to the class that caused the
doubt; exhausted -> a failure the check proved safe), else a same-key resend if
the provider dedupes keys (bounded, then a human), else nobody can know (the
effects table: hand over). :func:`run_attempts` is the single loop -- attempt,
timeout, classify, next delay, wait or park -- behind direct reads, direct writes
and compensations (:mod:`agentledger.engine._unknown`) and outbox deliveries
(:mod:`agentledger._outbox`); each supplies an :class:`Attempts` with its own
journal and waiting.

A ``Retry-After`` longer than :attr:`RetryPolicy.max_retry_after` (or infinite) is
the rate-limit class's failure: no delay is ever non-finite or unbounded.
Retry counts live in the step's journal entry (the outbox row's history), so a
parked or resumed step keeps counting where it stopped.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from agentledger._backoff import exponential, jittered
from agentledger.errors import (
    BusinessError,
    DeadlineReached,
    InProgress,
    InvalidArguments,
    NotSent,
    ProviderError,
    RateLimited,
    Refused,
    ToolError,
    ToolTimeout,
)
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import RetryPolicy, Tool
from agentledger.tools._status import Status

T = TypeVar("T")

#: Status checks answering ``pending`` before the outcome goes to a human.
MAX_STATUS_CHECKS = 8
#: Same-key resends of an unknown write with no status check (provider-keyed tools).
MAX_SAME_KEY_RETRIES = 3

_STATES = ("succeeded", "failed", "not_found", "pending")


class RetryAction(StrEnum):
    """What to do after a failed attempt (or a status check)."""

    RETRY = "retry"  # call again with the same key after ``delay``
    CHECK = "check"  # the outcome is unknown: resolve it (status check) after ``delay``
    FAIL = "fail"  # final, and nothing was applied (or it is the tool's own answer)
    GIVE_UP = "give_up"  # the outcome is unknown and cannot be settled: a human looks


# The module's shorthand for the actions.
RETRY, CHECK, FAIL, GIVE_UP = RetryAction


@dataclass
class RetryState:
    """Attempts so far, per failure class; persisted in the journal entry."""

    attempts: int = 0
    rate_limited: int = 0
    provider_error: int = 0
    timeout: int = 0
    in_progress: int = 0
    not_found: int = 0
    same_key: int = 0
    checks: int = 0
    # An earlier attempt of this step may have been applied (its outcome is unknown):
    # no failure may be recorded until the status check says otherwise.
    maybe_applied: bool = False
    doubt: str | None = None  # the failure class that made the outcome unknown
    history: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Any) -> RetryState:
        """The state journaled by :meth:`to_dict` (unknown fields ignored)."""
        if not isinstance(data, dict):
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class RetryDecision:
    """What to do after a failed attempt (or a status check)."""

    action: RetryAction
    delay: float = 0.0
    why: str = ""


def backoff(policy: RetryPolicy, n: int, retry_after: float | None = None) -> float | None:
    """Exponential backoff with jitter, never shorter than Retry-After.

    Returns None when Retry-After is beyond ``policy.max_retry_after`` (or not a
    finite number): that is the class's failure, not a delay.
    """
    delay = jittered(exponential(n, policy.base_delay, policy.max_delay))
    if retry_after is not None:
        if math.isnan(retry_after):
            return delay
        if not math.isfinite(retry_after) or retry_after > policy.max_retry_after:
            return None
        delay = max(delay, retry_after)
    return delay


def _counted(
    policy: RetryPolicy, state: RetryState, name: str, delay: float | None
) -> float | None:
    """Count one more failure of class ``name``; None once its retries are used up."""
    setattr(state, name, getattr(state, name) + 1)
    if getattr(state, name) > getattr(policy, name):
        return None
    return delay


def after_failure(
    policy: RetryPolicy,
    state: RetryState,
    error: ToolError,
    *,
    write: bool,
    checkable: bool = False,
    keyed: bool = False,
) -> RetryDecision:
    """Classify a failed attempt and record it in ``state``.

    ``write``: the call may change something; ``checkable``: the tool has a status
    check; ``keyed``: the provider dedupes our idempotency key.
    """
    state.history.append(error.error_class)
    if isinstance(error, BusinessError | Refused | InvalidArguments):
        return RetryDecision(FAIL, why=error.error_class)
    if isinstance(error, DeadlineReached):
        # Not called. Final -- unless an earlier attempt may have been applied.
        return (
            _unsettled(state, checkable) if write and state.maybe_applied else RetryDecision(FAIL)
        )
    if isinstance(error, RateLimited | NotSent):
        # Answered "not now", or provably never sent: this attempt applied nothing.
        if isinstance(error, RateLimited):
            n = state.rate_limited + 1
            delay = _counted(policy, state, "rate_limited", backoff(policy, n, error.retry_after))
        else:
            n = state.provider_error + 1
            delay = _counted(policy, state, "provider_error", backoff(policy, n))
        if delay is not None:
            return RetryDecision(RETRY, delay)
        return (
            _unsettled(state, checkable) if write and state.maybe_applied else RetryDecision(FAIL)
        )
    if isinstance(error, InProgress):
        # The same key's first request is still running: wait, then look again.
        delay = _counted(policy, state, "in_progress", backoff(policy, state.in_progress + 1))
        if not write:
            return RetryDecision(RETRY, delay) if delay is not None else RetryDecision(FAIL)
        _doubt(state, error)
        if delay is None:
            return _unsettled(state, checkable, "still in progress at the provider")
        if checkable:
            return RetryDecision(CHECK, delay)
        if keyed:
            return RetryDecision(RETRY, delay)
        return RetryDecision(GIVE_UP, why="the provider reports the request in progress")
    if not write:
        if isinstance(error, ProviderError):
            n = state.provider_error + 1
            delay = _counted(policy, state, "provider_error", backoff(policy, n))
            return RetryDecision(RETRY, delay) if delay is not None else RetryDecision(FAIL)
        if isinstance(error, ToolTimeout):
            delay = _counted(policy, state, "timeout", 0.0)
            return RetryDecision(RETRY, delay) if delay is not None else RetryDecision(FAIL)
        return RetryDecision(FAIL)
    # A write answered 5xx, timed out, failed in transit or crashed: did it apply?
    _doubt(state, error)
    if checkable:
        return RetryDecision(CHECK)
    return resend_same_key(policy, state, keyed, error)


def resend_same_key(
    policy: RetryPolicy, state: RetryState, keyed: bool, error: ToolError | None = None
) -> RetryDecision:
    """An unknown write with no status check: resend with the same key if the provider
    dedupes it (bounded), else nobody can know."""
    if not keyed:
        return RetryDecision(GIVE_UP, why="no status check and no provider idempotency")
    state.same_key += 1
    if state.same_key > MAX_SAME_KEY_RETRIES:
        return RetryDecision(
            GIVE_UP, why=f"still unknown after {state.same_key - 1} same-key resends"
        )
    delay = backoff(policy, state.same_key) if isinstance(error, ProviderError) else 0.0
    return RetryDecision(RETRY, delay or 0.0)


def after_status(policy: RetryPolicy, state: RetryState, status: Status) -> RetryDecision | None:
    """What a status check's answer means: None for ``succeeded`` / ``failed`` (the
    caller records them), else call again, check again later, fail or give up."""
    if status.state in ("succeeded", "failed"):
        return None
    if status.state == "not_found":
        # Proven not applied: the doubt is gone; the retry is charged to its class.
        state.maybe_applied = False
        doubt, state.doubt = state.doubt, None
        if doubt == ProviderError.error_class:
            n = state.provider_error + 1
            delay = _counted(policy, state, "provider_error", backoff(policy, n))
            return (
                RetryDecision(RETRY, delay) if delay is not None else RetryDecision(FAIL, why=doubt)
            )
        state.not_found += 1
        if state.not_found > MAX_SAME_KEY_RETRIES:
            return RetryDecision(FAIL, why=doubt or "not_found")
        return RetryDecision(RETRY, 0.0)
    if state.checks >= MAX_STATUS_CHECKS:
        return RetryDecision(GIVE_UP, why=f"still pending after {state.checks} status checks")
    return RetryDecision(CHECK, backoff(policy, state.checks) or 0.0)


def _doubt(state: RetryState, error: ToolError) -> None:
    state.maybe_applied = True
    if state.doubt is None or error.error_class != InProgress.error_class:
        state.doubt = error.error_class


def _unsettled(state: RetryState, checkable: bool, why: str = "") -> RetryDecision:
    state.maybe_applied = True
    if checkable:
        return RetryDecision(CHECK, why=why)
    return RetryDecision(GIVE_UP, why=why or "an earlier attempt may have been applied")


def next_delay(
    policy: RetryPolicy, state: RetryState, exc: ToolError, *, is_read: bool
) -> float | None:
    """Record a failure of a call with no side effect; the delay before the next
    attempt, or None for no retry (model calls use this)."""
    decision = after_failure(policy, state, exc, write=not is_read)
    return decision.delay if decision.action == RETRY else None


class Attempts(Generic[T]):
    """One step's (or one outbox row's) attempts: what :func:`run_attempts` drives.

    Subclasses say how to call, check, journal and wait; the loop decides.
    """

    policy: RetryPolicy
    state: RetryState
    write: bool = False
    checkable: bool = False
    keyed: bool = False
    max_calls: int | None = None  # total calls allowed (the outbox's attempts)
    # False: every new call goes through :meth:`wait`, even with no delay (the outbox
    # reschedules it, so one delivery stays within its lease: a call and a check).
    inline_retries: bool = True

    async def call(self) -> Any:
        """One attempt (with its timeout); raises a failure class."""
        raise NotImplementedError

    async def check(self) -> Status:
        """Ask the status check about the same key (errors: ``pending``)."""
        raise NotImplementedError

    async def before_call(self) -> bool:
        """Just before a call (e.g. take the effects-table claim). False: the call may
        not be made (the claim is held without a result): the loop gives up."""
        return True

    async def succeeded(self, result: Any, how: str) -> T:
        """Record a success (``how``: executed / status_resolved)."""
        raise NotImplementedError

    async def failed(self, error: ToolError) -> T:
        """Record a final failure that applied nothing."""
        raise NotImplementedError

    async def unknown(self, error: ToolError) -> None:
        """Record that the outcome is unknown (before resolving it)."""

    async def give_up(self, why: str) -> T:
        """The outcome cannot be settled: hand over (raises or returns)."""
        raise NotImplementedError

    async def wait(self, delay: float, error: ToolError, *, checking: bool) -> T | None:
        """Wait ``delay`` before the next attempt or check: return None to go on now,
        or a value to stop the loop with (or raise, e.g. to park the run)."""
        raise NotImplementedError


async def run_attempts(ops: Attempts[T], *, checking: bool = False) -> T:
    """Attempt, classify, wait or park, until settled: the one retry loop.

    ``checking``: start by resolving an unknown outcome instead of calling.
    """
    tried: ToolError | None = None  # the last failure of a call actually made
    while True:
        error: ToolError | None = None
        if checking:
            resolved = await _resolve(ops)
            if not isinstance(resolved, RetryDecision):
                return resolved
            decision = resolved
        else:
            if not await ops.before_call():
                return await ops.give_up("the effect is claimed and its outcome is unknown")
            ops.state.attempts += 1
            try:
                result = await ops.call()
            except Exception as exc:
                error = as_tool_error(exc)
                decision = after_failure(
                    ops.policy,
                    ops.state,
                    error,
                    write=ops.write,
                    checkable=ops.checkable,
                    keyed=ops.keyed,
                )
                if ops.write and decision.action in (CHECK, GIVE_UP):
                    await ops.unknown(error)
                decision = _bounded(ops, decision)
                if isinstance(error, DeadlineReached):
                    # Not called: the failure to report is the last call's, if one was made.
                    error = tried or error
                tried = error
            else:
                return await ops.succeeded(result, "executed")
        if decision.action == FAIL:
            return await ops.failed(error or _proven_failure(decision))
        if decision.action == GIVE_UP:
            return await ops.give_up(decision.why)
        checking = decision.action == CHECK
        if decision.delay > 0 or (decision.action == RETRY and not ops.inline_retries):
            reason = error or ToolError("status pending")
            stop = await ops.wait(decision.delay, reason, checking=checking)
            if stop is not None:
                return stop


async def _resolve(ops: Attempts[T]) -> RetryDecision | T:
    """Settle an unknown outcome: status check, same-key resend, or give up."""
    if not ops.checkable:
        return _bounded(ops, resend_same_key(ops.policy, ops.state, ops.keyed))
    ops.state.checks += 1
    status = await ops.check()
    if not isinstance(status, Status) or status.state not in _STATES:
        # A status check that answers nonsense could not tell: ask again later.
        ops.state.history.append("status_check:not_a_status")
        status = Status.pending()
    if status.state == "succeeded":
        ops.state.maybe_applied, ops.state.doubt = False, None
        return await ops.succeeded(status.result, "status_resolved")
    if status.state == "failed":
        ops.state.maybe_applied, ops.state.doubt = False, None
        return await ops.failed(BusinessError(status.error or "failed"))
    decision = after_status(ops.policy, ops.state, status)
    assert decision is not None
    return _bounded(ops, decision)


def _bounded(ops: Attempts[Any], decision: RetryDecision) -> RetryDecision:
    """Stop calling once ``max_calls`` calls were made (the outbox's attempts)."""
    if decision.action != RETRY or ops.max_calls is None or ops.state.attempts < ops.max_calls:
        return decision
    if ops.write and ops.state.maybe_applied:
        return RetryDecision(GIVE_UP, why=f"outcome unknown after {ops.state.attempts} attempts")
    return RetryDecision(FAIL, why="attempts exhausted")


def _proven_failure(decision: RetryDecision) -> ToolError:
    """The failure recorded when status checks proved every attempt not applied and
    the retries of the doubt's class are used up."""
    doubt = decision.why or "not_found"
    failure = ToolError(f"not applied (status check: not found); retries used up after {doubt}")
    failure.error_class = doubt
    return failure


class _Deadline:
    """The cancel of a task at its call's deadline, and whether it was made."""

    __slots__ = ("cancelling", "fired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task, self.fired = task, False
        self.cancelling = task.cancelling()  # cancel requests already made before the call

    def __call__(self) -> None:
        self.fired = True
        self.task.cancel()


async def call_with_timeout(fn: Callable[[], Awaitable[T]], timeout: float) -> T:
    """Await ``fn()`` for at most ``timeout`` seconds; a timeout is :class:`ToolTimeout`.

    With no time left at all the call is not made: :class:`DeadlineReached`.

    What ``asyncio.timeout`` does, written out because it runs around every call: the
    call runs in the current task (no extra Task per call, as ``asyncio.wait_for``
    makes on Python < 3.12), the task is cancelled at the deadline, and that cancel is
    taken back off the task's count once the call ends; the ``CancelledError`` it
    caused becomes the timeout unless another cancel was requested meanwhile (that one
    goes on as a cancel). No async context manager and no state object per call.
    """
    if not timeout > 0:  # also NaN
        raise DeadlineReached("no time left before the run's deadline; not called")
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("call_with_timeout must run inside a task")
    deadline = _Deadline(task)
    timer = task.get_loop().call_later(timeout, deadline)
    try:
        result = await fn()
    except BaseException as exc:
        timer.cancel()
        if deadline.fired:
            spent = task.uncancel() <= deadline.cancelling
            if spent and isinstance(exc, asyncio.CancelledError):
                raise ToolTimeout(f"no answer within {timeout:.2f} s") from None
        if isinstance(exc, TimeoutError):  # the call's own timeout is a timeout too
            raise ToolTimeout(f"no answer within {timeout:.2f} s") from None
        raise
    timer.cancel()
    if deadline.fired:
        task.uncancel()
    return result


async def ask_status(
    tool: Tool, ctx: ToolContext, args: dict[str, Any], history: list[str]
) -> Status:
    """Ask ``tool``'s status check about the key ``ctx`` carries, within the tool's
    timeout. A check that could not ask (it raised, timed out) answers ``pending``:
    ask again later; its failure class goes to ``history``."""
    status_check = tool.status_check
    assert status_check is not None
    try:
        return await call_with_timeout(lambda: status_check(ctx, args), tool.timeout)
    except Exception as exc:
        history.append(f"status_check:{as_tool_error(exc).error_class}")
        return Status.pending()


def as_tool_error(exc: BaseException) -> ToolError:
    """Any exception a tool raises, as a failure class (unexpected ones: ``tool_error``)."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, TimeoutError):
        return ToolTimeout(f"timed out: {exc}")
    return ToolError(f"{type(exc).__name__}: {exc}")
