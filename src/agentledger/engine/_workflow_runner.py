"""Workflows: plain async functions whose ``ctx.step`` / ``ctx.tool`` calls are
journaled by call order, exactly like an agent's steps.

The first pass of a step returns exactly what its replay will: the journal's JSON
round trip of the result (a value JSON cannot carry fails the step with
``not_journalable``), and a failure raises the same exception type on both
(:class:`StepFailed` for ``ctx.step``, the failure class for ``ctx.tool``). A
step's idempotency key and input hash are fixed by its first journal entry; a
replay that asks for the same step with other arguments is handed to a human
("nondeterminism").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from agentledger._canonical import NotJournalable, input_hash, journal_value, journaled_hash
from agentledger._workflow import Workflow
from agentledger.engine import _hooks as hooks
from agentledger.engine._execution import Execution, carries_held
from agentledger.engine._signals import Cancelled, Handover, HandoverReason, Park
from agentledger.engine._steps import ToolOutcome, close_duration, fail_step, new_step
from agentledger.engine._tool_step import run_tool_step
from agentledger.errors import (
    BusinessError,
    FailureClass,
    InProgress,
    InvalidArguments,
    ProviderError,
    RateLimited,
    Refused,
    ToolError,
    ToolTimeout,
)
from agentledger.records import StepStatus
from agentledger.tools._contract import Tool

_ERRORS: dict[str, type[ToolError]] = {
    "business_error": BusinessError,
    "refused": Refused,
    "not_allowed": Refused,
    "invalid_arguments": InvalidArguments,
    "rate_limited": RateLimited,
    "provider_error": ProviderError,
    "timeout": ToolTimeout,
    "in_progress": InProgress,
    "not_journalable": NotJournalable,
}
_DONE = (StepStatus.SUCCEEDED, StepStatus.FAILED)


def journaled_outcome(exe: Execution, step_no: int, outcome: ToolOutcome) -> ToolOutcome:
    """The outcome of a settled tool step as its journal entry states it.

    A replay can only return what the journal holds, so the first pass returns the
    same: the stored output (not the live object) and the stored failure class.
    """
    entry = exe.journal.get(step_no)
    if entry is None or entry.status not in _DONE:
        return outcome
    if entry.status == StepStatus.SUCCEEDED:
        return ToolOutcome(True, result=entry.output)
    return ToolOutcome(False, error_class=entry.error_class, error=entry.error)


def hash_of(value: Any) -> str | None:
    """The input hash of ``value``, or None when it is not JSON (then not checked)."""
    try:
        return input_hash(value)
    except (NotJournalable, RecursionError):
        return None


class StepFailed(ToolError):
    """A journaled ``ctx.step`` failed. Raised on the first pass (chaining the original
    exception) and on every replay alike, with the same message; ``failure`` is the
    class it was journaled with (the original exception's type name, or
    ``not_journalable``)."""

    error_class = FailureClass.STEP_FAILED

    def __init__(self, message: str, *, failure: str | None = None) -> None:
        super().__init__(message)
        self.failure = failure


class WorkflowContext:
    """What a workflow function receives: journaled steps, tools and sleeps."""

    def __init__(self, exe: Execution) -> None:
        self._exe = exe
        self._next = 1

    @property
    def run_id(self) -> str:
        return self._exe.run.id

    @property
    def input(self) -> Any:
        return self._exe.run.input

    @property
    def user_id(self) -> str | None:
        return self._exe.run.user_id

    def _take_step_no(self) -> int:
        step_no, self._next = self._next, self._next + 1
        return step_no

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once; on replay return its journaled result.

        The result is returned as the journal holds it (its JSON round trip); a
        failure raises :class:`StepFailed` on the first pass and on replay alike.
        """
        step_no = self._take_step_no()
        exe = self._exe
        digest = hash_of({"args": list(args), "kwargs": kwargs})
        prior = exe.prior(step_no, name, digest)
        if prior is not None and prior.status in _DONE:
            hooks.replayed_step(exe, prior)  # spans (hooks.py): marked replayed
            if prior.status == StepStatus.SUCCEEDED:
                return prior.output
            raise StepFailed(prior.error or "step failed", failure=prior.error_class)
        await exe.before_step()
        step = new_step(exe, step_no, "step", name, status=StepStatus.NEW)
        with hooks.workflow_step(exe, step_no, name) as traced:
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                result = journal_value(result)
            except Exception as exc:
                failure = exc.error_class if isinstance(exc, NotJournalable) else type(exc).__name__
                step.status, step.error_class, step.error = StepStatus.FAILED, failure, str(exc)
                step.attempts = 1  # the function was called, once, and raised
                close_duration(step)
                await exe.record(step)
                traced.resolution, traced.extra["error_class"] = "failed", failure
                raise StepFailed(step.error or "step failed", failure=failure) from exc
            step.status, step.output, step.attempts = StepStatus.SUCCEEDED, result, 1
            close_duration(step)
            await exe.record(step)
            traced.resolution = "succeeded"
        return step.output

    async def tool(self, tool: str | Tool, /, **arguments: Any) -> Any:
        """Call a registered tool under its contract; raise its failure class on failure.

        The arguments must be canonical JSON (else :class:`InvalidArguments`). The
        idempotency key is ``run_id:step_no:name:input_hash(arguments)``, fixed when
        the step is first journaled: a resumed step keeps its journaled key.
        """
        name = tool if isinstance(tool, str) else tool.name
        step_no = self._take_step_no()
        exe = self._exe
        try:
            args = journal_value(arguments)
            digest: str | None = journaled_hash(args)
        except NotJournalable as exc:
            args, digest = None, None
            refusal = f"arguments of {name} are not JSON ({exc}); pass JSON values only"
        prior = exe.prior(step_no, name, digest)
        if prior is None:
            await exe.before_step(carries=carries_held(exe.tools.get(name)))
        if args is None and prior is not None and prior.status not in _DONE:
            raise Handover(
                HandoverReason.NONDETERMINISM,
                f"step {step_no} ({name}) is in flight but the code now passes: {refusal}",
            )
        if args is None and prior is None:
            step = new_step(exe, step_no, "tool", name, status=StepStatus.NEW)
            step.input = {"refused": repr(arguments)[:500]}
            outcome = await fail_step(exe, step, InvalidArguments(refusal))
        else:
            if prior is not None and prior.idempotency_key is not None:
                key = prior.idempotency_key  # never recomputed on resume
            else:
                key = f"{exe.key(step_no)}:{name}:{digest}"
            outcome = await run_tool_step(exe, step_no, name, args or {}, key=key)
        outcome = journaled_outcome(exe, step_no, outcome)
        if outcome.ok:
            return outcome.result
        raise _ERRORS.get(outcome.error_class or "", ToolError)(outcome.error or "tool failed")

    async def sleep(self, seconds: float) -> None:
        """A durable sleep: the run parks and no worker is held while it waits.

        A cancel request ends the sleep at once (nothing is in flight during a sleep).
        """
        step_no = self._take_step_no()
        exe = self._exe
        prior = exe.prior(step_no, "sleep")
        if prior is not None and prior.status == StepStatus.SUCCEEDED:
            return
        if prior is None:
            await exe.before_step()
            step = new_step(exe, step_no, "sleep", "sleep", status=StepStatus.STARTED)
            step.output = {"until": exe.clock.now() + seconds}
            await exe.record(step)
        else:
            step = prior
        until = float(step.output["until"])
        if exe.clock.now() < until:
            cancel = exe.cancel_reason()
            if cancel is not None:
                raise Cancelled(cancel)
            raise Park(until, f"sleeping until {until:.0f}")
        step.status = StepStatus.SUCCEEDED
        close_duration(step)
        await exe.record(step)


async def run_workflow(exe: Execution, workflow: Workflow) -> Any:
    """Run (or replay) a workflow function to its result."""
    ctx = WorkflowContext(exe)
    return await workflow.fn(ctx, exe.run.input)
