"""Side-effecting calls and their unknown outcomes (docs/architecture.md, "Unknown outcomes").

A write that timed out, was answered 5xx, failed in transit, crashed, or a
``started`` write found on resume, did *something or nothing*. It is never retried
blind and never given up on silently:

* the tool has a status check -> ask the provider about the same key:
  succeeded -> record its result; not found -> call again with the same key
  (charged to the class that caused the doubt; used up -> a failure the check
  proved safe); pending -> ask again later (parking the run for long waits);
  failed -> failure path;
* no status check but the provider honours our key -> call again with the same
  key (the provider returns the first response), a bounded number of times, then
  a human;
* neither -> the effects table: a claim without a result means nobody can know,
  so the run goes to ``needs_human`` and the tool is never called a second time.

Only what provably applied nothing is a failure: the provider's answer (business,
refused, invalid), a 429, a connection that never opened, a call never made for
want of time (``deadline``). A 409 "request in progress" means the same request is
running: wait, then check or resend with the same key. The model never decides to
retry a write. The loop itself is :func:`agentledger.engine._retries.run_attempts`.
"""

from __future__ import annotations

from typing import Any

from agentledger.engine import _inflight as inflight
from agentledger.engine._execution import Execution
from agentledger.engine._retries import RetryState, ask_status, run_attempts
from agentledger.engine._signals import Cancelled, Handover, HandoverReason
from agentledger.engine._steps import (
    StepAttempts,
    ToolOutcome,
    claim_effect,
    close_duration,
    fail_step,
    take_events,
    tool_context,
)
from agentledger.errors import BusinessError, Refused, ToolError
from agentledger.records import Effect, EffectStatus, Step, StepStatus
from agentledger.store._base import NewEvent
from agentledger.tools._contract import Tool
from agentledger.tools._status import Status

#: How long a run waits for another run's result on a shared effect key, in tool timeouts.
SHARED_WAIT_TIMEOUTS = 3
SHARED_POLL_SECONDS = 0.1


async def drive_write(
    exe: Execution, step: Step, tool: Tool, args: dict[str, Any], key: str
) -> ToolOutcome:
    """Call a side-effecting tool at most once per outcome, resolving unknowns."""
    step.idempotency_key = key
    ops = WriteAttempts(exe, step, tool, args, key)
    if step.status in (StepStatus.STARTED, StepStatus.UNKNOWN):
        # Found in flight on resume (or after waiting for another execution of it).
        ops.state.maybe_applied = True
        exe.pending_events.append(
            NewEvent("tool.resumed_unknown", exe.owner, {"tool": tool.name, "key": key})
        )
        return await run_attempts(ops, checking=True)
    if step.status == StepStatus.RETRYING:
        # Parked after an attempt that applied nothing (or a same-key resend is owed).
        # Journal ``started`` again first: a crash during the next call must be found
        # as an unknown outcome on resume, not as a retry that may call blind.
        step.status = StepStatus.STARTED
        await exe.record(step, events=take_events(exe))
        return await run_attempts(ops)
    # ``started`` (with the key) is durable before the call; the journal entry itself
    # is the audit record of it. Whether the tool can be status-checked goes with it: an
    # operator's resume keeps such a step for its check and refuses any other unknown
    # one until a person settles it (observe/_queries/resume.py).
    step.status = StepStatus.STARTED
    if isinstance(step.input, dict):
        step.input["status_check"] = tool.status_check is not None
    if tool.idempotency == "effects":
        if tool.effect_key is not None and isinstance(step.input, dict):
            # A key shared across runs (e.g. one welcome gift per guest).
            ctx = tool_context(exe, step.step_no, key, tool, 1)
            step.input["effect_key"] = tool.effect_key(args, ctx)
        winner = await claim_effect(exe, step, guard_key(step, key))
        if winner is not None:
            return await _wait_for_winner(exe, step, tool, winner)
    else:
        known = exe.cancel_reason()
        await exe.record(step, events=take_events(exe))
        cancel = exe.cancel_reason()
        if cancel is not None and known is None and step.kind != "compensation":
            # Read back by this entry's fence (it carried the previous write's outcome,
            # whose own commit would have stopped the run at the boundary): not called.
            await fail_step(
                exe,
                step,
                Refused(f"{tool.name} was not called: the run was cancelled ({cancel})"),
                events=take_events(exe),
            )
            raise Cancelled(cancel)
    if exe.run.restored_at is not None:
        return await _first_write_after_restore(exe, ops)
    return await run_attempts(ops)


async def _first_write_after_restore(exe: Execution, ops: WriteAttempts) -> ToolOutcome:
    """A write a restored run makes for the first time (its ``started`` is journaled).

    The store came from a backup that may be older than the provider's ledger: this very
    write (same key) may have been made after the backup, by the run's earlier life. So
    it is treated as an unknown outcome, never sent blind: a tool with a status check is
    asked first (succeeded -> recorded; not found -> sent with the same key); one whose
    provider dedupes keys is sent with the same key; one with neither goes to a person
    (its effects-table claim was lost with the backup), who settles it (`runs settle`).
    """
    tool, key = ops.tool, ops.key
    event = NewEvent("tool.restored_check", exe.owner, {"tool": tool.name, "key": key})
    if ops.checkable:
        exe.pending_events.append(event)
        ops.state.maybe_applied = True
        return await run_attempts(ops, checking=True)
    if ops.keyed:
        exe.pending_events.append(event)
        return await run_attempts(ops)
    await exe.event(event.type, event.data)
    raise Handover(
        HandoverReason.UNKNOWN_OUTCOME,
        f"{tool.name} (key {key}) was not called: the store was restored from a backup and "
        "this write may have been made after it; it has no status check and no provider "
        "keys. Check with the provider, then `agentledger runs settle` and `runs resume`",
    )


class WriteAttempts(StepAttempts):
    """The attempts of one write step (or compensation): unknowns journaled and
    resolved with the same key, effects-table guarded tools completed or released."""

    def __init__(
        self, exe: Execution, step: Step, tool: Tool, args: dict[str, Any], key: str
    ) -> None:
        super().__init__(exe, step, tool, args, key)
        self.write = True
        self.checkable = tool.status_check is not None
        self.keyed = tool.idempotency == "provider"

    async def check(self) -> Status:
        ctx = tool_context(self.exe, self.step.step_no, self.key, self.tool, self.state.attempts)
        # A status check reads; it runs even past the run's deadline.
        ctx.deadline = self.exe.clock.monotonic() + self.tool.timeout
        return await ask_status(self.tool, ctx, self.args, self.state.history)

    async def unknown(self, error: ToolError) -> None:
        exe, step = self.exe, self.step
        step.status, step.attempts = StepStatus.UNKNOWN, self.state.attempts
        step.error_class, step.error = error.error_class, str(error)
        step.output = {"retry": self.state.to_dict()}
        await exe.record(
            step,
            events=[
                *take_events(exe),
                NewEvent(
                    "tool.unknown_outcome",
                    exe.owner,
                    {"tool": self.tool.name, "key": self.key, "error": str(error)},
                ),
            ],
        )

    async def succeeded(self, result: Any, how: str) -> ToolOutcome:
        exe, step, tool, state = self.exe, self.step, self.tool, self.state
        step.status, step.output, step.attempts = StepStatus.SUCCEEDED, result, state.attempts
        step.error_class = step.error = None
        close_duration(step, exe.clock.now())
        effects = []
        if tool.idempotency == "effects":
            effects.append(self._effect("done", result))
        events = take_events(exe)
        event = "tool.executed" if how == "executed" else f"tool.{how}"
        if event != "tool.executed" or state.attempts > 1 or state.checks > 0:
            # A plain first-attempt success is audited by its ``step.succeeded`` record
            # (which names the key); one that followed a status check (sent again after
            # "not found") gets its own record of how it was resolved.
            events.append(
                NewEvent(
                    event,
                    exe.owner,
                    {
                        "tool": tool.name,
                        "key": self.key,
                        "attempts": state.attempts,
                        "checks": state.checks,
                    },
                )
            )
        # A plain success of a tool whose outcome resume can settle by asking (status
        # check) or resending with the same key is carried by the run's next write: a
        # crash before that leaves ``started``, settled by the same check or resend.
        # Not when another execution of this step waits to re-read the journal.
        hold = (
            not effects
            and not events
            and (self.checkable or self.keyed)
            and not inflight.contended((exe.run.id, step.step_no))
        )
        await exe.record(step, effects=effects, events=events, hold=hold)
        return ToolOutcome(True, result=result)

    async def failed(self, error: ToolError) -> ToolOutcome:
        self.step.attempts = self.state.attempts
        effects = []
        if self.tool.idempotency == "effects":
            # Proven not applied (an answer, or never sent): the claim is released.
            effects.append(self._effect("failed"))
        return await fail_step(
            self.exe, self.step, error, events=take_events(self.exe), effects=effects
        )

    async def give_up(self, why: str) -> ToolOutcome:
        tool, key = self.tool, self.key
        if tool.idempotency == "effects":
            effect = await self.exe.store.get_effect(guard_key(self.step, key))
            if effect is not None and effect.status == EffectStatus.DONE:
                return await self.succeeded(effect.result, "effect_found")
            raise Handover(
                HandoverReason.UNKNOWN_OUTCOME,
                f"{tool.name} (key {key}) may or may not have happened and has no status "
                f"check ({why}); check with the provider, then resolve the run by hand",
            )
        raise Handover(
            HandoverReason.UNKNOWN_OUTCOME, f"{tool.name} (key {key}): outcome unknown, {why}"
        )

    def _effect(self, status: str, result: Any = None) -> Effect:
        return Effect(
            key=guard_key(self.step, self.key),
            run_id=self.exe.run.id,
            step_no=self.step.step_no,
            status=status,
            result=result,
        )


def guard_key(step: Step, key: str) -> str:
    """The effects-table key of a step: its own key unless the tool shares one."""
    if isinstance(step.input, dict) and isinstance(step.input.get("effect_key"), str):
        return str(step.input["effect_key"])
    return key


async def _wait_for_winner(exe: Execution, step: Step, tool: Tool, winner: Effect) -> ToolOutcome:
    """Another run holds the effect key: wait for its result instead of calling."""
    deadline = exe.clock.monotonic() + max(tool.timeout, 1.0) * SHARED_WAIT_TIMEOUTS
    while exe.clock.monotonic() < deadline:
        current = await exe.store.get_effect(winner.key)
        if current is not None and current.status == EffectStatus.DONE:
            step.status, step.output = StepStatus.SUCCEEDED, current.result
            step.idempotency_key = None  # the winner's step holds the key
            close_duration(step, exe.clock.now())
            await exe.record(
                step,
                events=[
                    *take_events(exe),
                    NewEvent(
                        "tool.effect_shared",
                        exe.owner,
                        {"tool": tool.name, "key": winner.key, "winner": winner.run_id},
                    ),
                ],
            )
            return ToolOutcome(True, result=current.result)
        if current is not None and current.status == EffectStatus.FAILED:
            return await fail_step(
                exe, step, BusinessError(f"{tool.name} failed in {winner.run_id}")
            )
        await exe.clock.sleep(SHARED_POLL_SECONDS)
    raise Handover(
        HandoverReason.UNKNOWN_OUTCOME,
        f"{tool.name}: effect {winner.key} held by {winner.run_id} has no result yet",
    )


__all__ = ["RetryState", "WriteAttempts", "drive_write", "guard_key"]
