"""The leaf helpers every kind of tool step shares: the outcome type, building and
failing a journal entry, a tool's context, audit events carried to the next write,
short waits versus parking, and the effects-table claim.

:mod:`~agentledger.engine._tool_step` (the protocol), :mod:`~agentledger.engine._unknown`
(unknown outcomes) and :mod:`~agentledger.engine._approvals` (the gate) build on this
module; it imports none of them.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from agentledger.engine import _hooks as hooks
from agentledger.engine._execution import Execution
from agentledger.engine._retries import Attempts, RetryState, call_with_timeout
from agentledger.engine._signals import Park
from agentledger.errors import ToolError
from agentledger.records import Effect, EffectStatus, Step, StepStatus
from agentledger.store._base import EffectClaimed, NewEvent
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import Tool


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
        store=exe.store,
        principal=exe.principal,
    )


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
        # spans (hooks.py): the execute_tool span and the step duration histogram
        with hooks.tool_attempt(self.exe, self.step, self.tool, self.key, self.state.attempts):
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
    until, why = exe.clock.now() + delay, f"{step.name} backing off {delay:.1f} s"
    # The entry and the run's ``waiting`` state commit together: a worker killed right
    # after the entry must not leave the run to be resumed before ``until``.
    await exe.record(
        step,
        park_until=until,
        events=[*take_events(exe), NewEvent("run.parked", exe.owner, {"why": why, "until": until})],
    )
    raise Park(until, why, committed=True)


async def claim_effect(exe: Execution, step: Step, key: str) -> Effect | None:
    """Journal ``started`` and claim the effect key in one transaction.

    Returns the winner's effect when another run or step already holds the key.
    """
    effect = Effect(key=key, run_id=exe.run.id, step_no=step.step_no, status=EffectStatus.CLAIMED)
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
    "take_events",
    "tool_context",
    "wait_or_park",
]
