"""One tool step, per the step protocol of DESIGN.md. This is where a tool call
is journaled.

1. The journal says step n succeeded (or failed for good): return that.
2. Validate the proposed arguments; compute the server's arguments.
3. Policy: allow, deny (``not_allowed``) or park for approval.
4. Outbox tools: write the outbox row with the journal entry and return.
5. Writes: journal ``started`` with the key (and claim the effect key when the
   effects table guards the tool) *before* calling.
6. Call with ``min(tool timeout, time left)``; retry by failure class.
7. Journal the outcome; it is committed before the next step begins.

A write that timed out, or a ``started`` write found on resume, has an unknown
outcome and is resolved by :mod:`agentledger.engine.unknown`, never by a blind
second call. Reads and writes share one attempt loop
(:func:`agentledger.engine.retries.run_attempts`). Within one process a step is
never attempted twice at once (:mod:`agentledger.engine.inflight`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from agentledger.engine import approvals as approval_gate
from agentledger.engine import inflight
from agentledger.engine.execution import Execution
from agentledger.engine.retries import (
    Attempts,
    RetryState,
    as_tool_error,
    call_with_timeout,
    run_attempts,
)
from agentledger.engine.signals import Park
from agentledger.errors import InvalidArguments, ToolError
from agentledger.records import Effect, OutboxItem, Step, StepStatus
from agentledger.store.base import EffectClaimed, NewEvent
from agentledger.tools.context import ToolContext
from agentledger.tools.contract import Tool

_REPLAYABLE = {StepStatus.SUCCEEDED, StepStatus.FAILED}
_IN_FLIGHT = {StepStatus.STARTED, StepStatus.UNKNOWN, StepStatus.RETRYING}


@dataclass
class ToolOutcome:
    """What a tool step produced: a result, or a failure class and message."""

    ok: bool
    result: Any = None
    error_class: str | None = None
    error: str | None = None

    def for_model(self) -> str:
        """The tool message content the model sees."""
        if self.ok:
            return json.dumps(self.result, default=str)
        return json.dumps({"error": self.error_class, "message": self.error})


def _replay(step: Step) -> ToolOutcome:
    if step.status == StepStatus.SUCCEEDED:
        return ToolOutcome(True, result=step.output)
    return ToolOutcome(False, error_class=step.error_class, error=step.error)


def new_step(exe: Execution, step_no: int, kind: str, name: str, **fields: Any) -> Step:
    return Step(
        run_id=exe.run.id,
        step_no=step_no,
        kind=kind,
        name=name,
        lease_epoch=exe.epoch,
        started_at=exe.clock.now(),
        **fields,
    )


async def fail_step(
    exe: Execution,
    step: Step,
    error: ToolError,
    *,
    events: list[NewEvent] | None = None,
    effects: list[Effect] | None = None,
) -> ToolOutcome:
    """Journal a final failure and return it as an outcome."""
    step.status = StepStatus.FAILED
    step.error_class, step.error = error.error_class, str(error)
    step.output = error.data if isinstance(error.data, dict | list) else None
    close_duration(step, exe.clock.now())
    await exe.record(step, events=events or [], effects=effects or [])
    return ToolOutcome(False, error_class=step.error_class, error=step.error)


def close_duration(step: Step, now: float | None = None) -> None:
    """Set the step's duration from its start to ``now`` (default: the wall clock)."""
    if step.started_at is not None:
        end = time.time() if now is None else now
        step.duration_ms = round((end - step.started_at) * 1000, 3)


def tool_context(exe: Execution, step_no: int, key: str, tool: Tool, attempt: int) -> ToolContext:
    # Compensations must run even when the run is out of time.
    left = tool.timeout if exe.compensating else exe.time_left()
    timeout = max(0.0, min(tool.timeout, left))
    return ToolContext(
        run_id=exe.run.id,
        step_no=step_no,
        idempotency_key=key,
        deadline=exe.clock.monotonic() + timeout,
        tenant_id=exe.run.tenant_id,
        user_id=exe.run.user_id,
        attempt=attempt,
        run_input=exe.run.input,
        resources=exe.resources,
        clock=exe.clock,
    )


async def run_tool_step(
    exe: Execution,
    step_no: int,
    name: str,
    raw_args: dict[str, Any] | str,
    *,
    kind: str = "tool",
    key: str | None = None,
    compensates: int | None = None,
) -> ToolOutcome:
    """Execute (or replay) step ``step_no``: a call of tool ``name``.

    Never two attempts of one step at once in this process: a second entrant (the
    same run re-claimed while the first is still calling) waits for the first, then
    goes on from what the journal says -- a ``started`` write is status-checked.
    """
    async with inflight.exclusive((exe.run.id, step_no)) as fresh:
        if not fresh:
            await _reload(exe, step_no)
        return await _tool_step(exe, step_no, name, raw_args, kind, key, compensates)


async def _reload(exe: Execution, step_no: int) -> None:
    """Re-read one journal entry another execution of this run may have written."""
    for step in await exe.store.load_journal(exe.run.id):
        if step.step_no == step_no:
            exe.journal[step_no] = step


async def _tool_step(
    exe: Execution,
    step_no: int,
    name: str,
    raw_args: dict[str, Any] | str,
    kind: str,
    key: str | None,
    compensates: int | None,
) -> ToolOutcome:
    prior = exe.prior(step_no, name)
    if prior is not None and prior.status in _REPLAYABLE:
        return _replay(prior)
    key = key or exe.key(step_no)
    step = prior or new_step(exe, step_no, kind, name, status="")
    tool = exe.tools.get(name)
    if tool is None:
        known = ", ".join(sorted(exe.tools)) or "none"
        return await fail_step(
            exe, step, InvalidArguments(f"unknown tool {name!r}; tools: {known}")
        )
    if prior is not None and prior.status in _IN_FLIGHT | {StepStatus.WAITING}:
        args = prior.input["args"]
    else:
        prepared = await _prepare(exe, step, tool, raw_args, key)
        if isinstance(prepared, ToolOutcome):
            return prepared
        args = prepared
        if compensates is not None:
            step.input["compensates"] = compensates
    if kind != "compensation" and (prior is None or prior.status == StepStatus.WAITING):
        verdict = await approval_gate.gate(exe, step, tool, args)
        if verdict is not None:
            return verdict
    if tool.delivery == "outbox":
        return await _enqueue(exe, step, tool, args, key)
    if not tool.writes:
        return await _call_read(exe, step, tool, args, key)
    from agentledger.engine.unknown import drive_write  # unknown.py builds on this module

    return await drive_write(exe, step, tool, args, key)


async def _prepare(
    exe: Execution, step: Step, tool: Tool, raw_args: dict[str, Any] | str, key: str
) -> dict[str, Any] | ToolOutcome:
    """Parse and validate the model's arguments; fill the server's."""
    if isinstance(raw_args, str):
        try:
            raw_args = json.loads(raw_args) if raw_args.strip() else {}
        except json.JSONDecodeError as exc:
            step.input = {"raw": raw_args}
            return await fail_step(
                exe,
                step,
                InvalidArguments(
                    f"arguments for {tool.name} are not valid JSON ({exc.msg}); send a JSON object"
                ),
            )
    if not isinstance(raw_args, dict):
        step.input = {"raw": raw_args}
        return await fail_step(
            exe, step, InvalidArguments(f"arguments for {tool.name} must be a JSON object")
        )
    try:
        args, ignored = tool.validate(raw_args)
    except InvalidArguments as exc:
        step.input = {"raw": raw_args}
        return await fail_step(exe, step, exc)
    events = []
    if ignored:
        events.append(
            NewEvent(
                "tool.server_args_overridden",
                "policy",
                {"tool": tool.name, "model_values": ignored},
            )
        )
    if tool.server_args:
        ctx = tool_context(exe, step.step_no, key, tool, 1)
        try:
            args = await call_with_timeout(
                lambda: tool.fill_server_args(ctx, args), ctx.time_left()
            )
        except Exception as exc:
            step.input = {"args": args, "ignored_model_args": ignored}
            return await fail_step(exe, step, as_tool_error(exc), events=events)
    step.input = {"args": args}
    if ignored:
        step.input["ignored_model_args"] = ignored
    exe.pending_events.extend(events)
    return args


async def _enqueue(
    exe: Execution, step: Step, tool: Tool, args: dict[str, Any], key: str
) -> ToolOutcome:
    """Decide an async effect: the outbox row commits with the journal entry."""
    ctx = tool_context(exe, step.step_no, key, tool, 1)
    outbox_key = tool.outbox_key(args, ctx) if tool.outbox_key else f"{key}:{tool.name}"
    item = OutboxItem(
        key=outbox_key,
        run_id=exe.run.id,
        step_no=step.step_no,
        tool=tool.name,
        payload={"args": args},
    )
    step.status, step.idempotency_key = StepStatus.SUCCEEDED, key
    step.output = {"queued": True, "outbox_key": outbox_key}
    close_duration(step, exe.clock.now())
    await exe.record(
        step,
        outbox=[item],
        events=[
            *take_events(exe),
            NewEvent("outbox.enqueued", exe.owner, {"tool": tool.name, "key": outbox_key}),
        ],
    )
    return ToolOutcome(True, result=step.output)


def take_events(exe: Execution) -> list[NewEvent]:
    events, exe.pending_events = exe.pending_events, []
    return events


class StepAttempts(Attempts[ToolOutcome]):
    """The attempts of one journaled tool step: the tool's timeout and the run's
    deadline, short waits in the worker, long ones park the run."""

    def __init__(
        self, exe: Execution, step: Step, tool: Tool, args: dict[str, Any], key: str
    ) -> None:
        self.exe, self.step, self.tool, self.args, self.key = exe, step, tool, args, key
        self.policy = tool.retry
        self.state = RetryState.from_dict(
            step.output.get("retry") if isinstance(step.output, dict) else None
        )

    async def call(self) -> Any:
        ctx = tool_context(self.exe, self.step.step_no, self.key, self.tool, self.state.attempts)
        return await call_with_timeout(lambda: self.tool.call(ctx, self.args), ctx.time_left())

    async def succeeded(self, result: Any, how: str) -> ToolOutcome:
        step = self.step
        step.status, step.output, step.attempts = StepStatus.SUCCEEDED, result, self.state.attempts
        step.error_class = step.error = None
        close_duration(step, self.exe.clock.now())
        await self.exe.record(step, events=take_events(self.exe))
        return ToolOutcome(True, result=result)

    async def failed(self, error: ToolError) -> ToolOutcome:
        self.step.attempts = self.state.attempts
        return await fail_step(self.exe, self.step, error, events=take_events(self.exe))

    async def give_up(self, why: str) -> ToolOutcome:  # a read always settles
        raise AssertionError(f"a read cannot have an unknown outcome ({why})")

    async def wait(self, delay: float, error: ToolError, *, checking: bool) -> ToolOutcome | None:
        status = StepStatus.UNKNOWN if checking else StepStatus.RETRYING
        await wait_or_park(self.exe, self.step, self.state, delay, error, status=status)
        return None


async def _call_read(
    exe: Execution, step: Step, tool: Tool, args: dict[str, Any], key: str
) -> ToolOutcome:
    return await run_attempts(StepAttempts(exe, step, tool, args, key))


async def wait_or_park(
    exe: Execution,
    step: Step,
    state: RetryState,
    delay: float,
    error: ToolError,
    *,
    status: str = StepStatus.RETRYING,
) -> None:
    """Sleep a short backoff in the worker; park the run for a long one."""
    if not math.isfinite(delay) or delay < 0:  # never a delay that is no time at all
        raise ValueError(f"not a usable delay: {delay!r}")
    if delay <= exe.park_threshold:
        if delay > 0:
            await exe.clock.sleep(delay)
        return
    step.status, step.attempts = status, state.attempts
    step.output = {"retry": state.to_dict()}
    step.error_class, step.error = error.error_class, str(error)
    await exe.record(step, events=take_events(exe))
    raise Park(exe.clock.now() + delay, f"{step.name} backing off {delay:.1f} s")


async def claim_effect(exe: Execution, step: Step, key: str) -> Effect | None:
    """Journal ``started`` and claim the effect key in one transaction.

    Returns the winner's effect when another run or step already holds the key.
    """
    effect = Effect(key=key, run_id=exe.run.id, step_no=step.step_no, status="claimed")
    try:
        await exe.record(step, effects=[effect], events=take_events(exe))
    except EffectClaimed as exc:
        return exc.effect
    return None


__all__ = [
    "StepAttempts",
    "ToolOutcome",
    "claim_effect",
    "close_duration",
    "fail_step",
    "new_step",
    "run_tool_step",
    "take_events",
    "tool_context",
    "wait_or_park",
]
