"""Side-effecting calls and their unknown outcomes (DESIGN.md, "Unknown outcomes").

A write that timed out, or a ``started`` write found on resume, did *something
or nothing*. It is never retried blind and never given up on silently:

* the tool has a status check -> ask the provider about the same key:
  succeeded -> record its result; not found -> call again with the same key;
  pending -> ask again later (parking the run for long waits); failed -> failure path;
* no status check but the provider honours our key -> call again with the same
  key (the provider returns the first response);
* neither -> the effects table: a claim without a result means nobody can know,
  so the run goes to ``needs_human`` and the tool is never called a second time.

The model never decides to retry a write.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agentledger.engine.execution import Execution
from agentledger.engine.retries import (
    RetryState,
    as_tool_error,
    backoff,
    call_with_timeout,
    next_delay,
)
from agentledger.engine.signals import Handover
from agentledger.engine.tool_step import (
    ToolOutcome,
    claim_effect,
    close_duration,
    fail_step,
    take_events,
    tool_context,
    wait_or_park,
)
from agentledger.errors import (
    BusinessError,
    InvalidArguments,
    ProviderError,
    RateLimited,
    Refused,
    ToolError,
)
from agentledger.records import Effect, Step, StepStatus
from agentledger.store.base import NewEvent
from agentledger.tools.context import ToolContext
from agentledger.tools.contract import Tool
from agentledger.tools.status import Status

MAX_STATUS_CHECKS = 8
MAX_SAME_KEY_RETRIES = 3
_CALL, _CHECK = "call", "check"


async def drive_write(
    exe: Execution, step: Step, tool: Tool, args: dict[str, Any], key: str
) -> ToolOutcome:
    """Call a side-effecting tool at most once per outcome, resolving unknowns."""
    previous = step.output.get("retry") if isinstance(step.output, dict) else None
    state = RetryState.from_dict(previous)
    step.idempotency_key = key
    if step.status in (StepStatus.STARTED, StepStatus.UNKNOWN):
        mode = _CHECK
        exe.pending_events.append(
            NewEvent("tool.resumed_unknown", exe.owner, {"tool": tool.name, "key": key})
        )
    elif step.status == StepStatus.RETRYING:
        mode = _CALL  # the last attempt was refused (429) or the provider dedupes the key
    else:
        # ``started`` (with the key) is durable before the call; the journal entry
        # itself is the audit record of it.
        step.status = StepStatus.STARTED
        if tool.idempotency == "effects":
            if tool.effect_key is not None and isinstance(step.input, dict):
                # A key shared across runs (e.g. one welcome gift per guest).
                ctx = tool_context(exe, step.step_no, key, tool, 1)
                step.input["effect_key"] = tool.effect_key(args, ctx)
            winner = await claim_effect(exe, step, guard_key(step, key))
            if winner is not None:
                return await _wait_for_winner(exe, step, tool, winner)
        else:
            await exe.record(step, events=take_events(exe))
        mode = _CALL
    while True:
        if mode == _CALL:
            outcome = await _call(exe, step, tool, args, key, state)
            if isinstance(outcome, ToolOutcome):
                return outcome
            mode = _CHECK
        else:
            resolved = await _resolve(exe, step, tool, args, key, state)
            if isinstance(resolved, ToolOutcome):
                return resolved
            mode = resolved


async def _call(
    exe: Execution, step: Step, tool: Tool, args: dict[str, Any], key: str, state: RetryState
) -> ToolOutcome | None:
    """Call until success, a final failure (outcome), or an unknown outcome (None)."""
    while True:
        state.attempts += 1
        ctx = tool_context(exe, step.step_no, key, tool, state.attempts)
        try:
            result = await call_with_timeout(lambda: tool.call(ctx, args), ctx.time_left())
        except Exception as exc:
            error = as_tool_error(exc)
            definitely_not_applied = isinstance(error, RateLimited) or (
                isinstance(error, ProviderError) and tool.idempotency == "provider"
            )
            if definitely_not_applied:
                delay = next_delay(tool.retry, state, error, is_read=False)
                if delay is None:
                    return await _fail(exe, step, tool, error, state)
                await wait_or_park(exe, step, state, delay, error)
                continue
            if isinstance(error, BusinessError | Refused | InvalidArguments):
                return await _fail(exe, step, tool, error, state)
            # Timeout, transport failure, unkeyed 5xx or a tool crash: unknown.
            state.history.append(error.error_class)
            step.status, step.attempts = StepStatus.UNKNOWN, state.attempts
            step.error_class, step.error = error.error_class, str(error)
            step.output = {"retry": state.to_dict()}
            await exe.record(
                step,
                events=[
                    *take_events(exe),
                    NewEvent(
                        "tool.unknown_outcome",
                        exe.owner,
                        {"tool": tool.name, "key": key, "error": str(error)},
                    ),
                ],
            )
            return None
        return await _succeed(exe, step, tool, key, result, state, "tool.executed")


async def _resolve(
    exe: Execution, step: Step, tool: Tool, args: dict[str, Any], key: str, state: RetryState
) -> ToolOutcome | str:
    """Find out what an unknown write did. Returns an outcome or the next mode."""
    if tool.status_check is not None:
        state.checks += 1
        ctx = _status_context(exe, step, tool, key, state)
        status_check = tool.status_check
        try:
            status = await call_with_timeout(lambda: status_check(ctx, args), tool.timeout)
        except Exception as exc:  # could not ask: ask again later
            status = Status.pending()
            state.history.append(f"status_check:{as_tool_error(exc).error_class}")
        if status.state == "succeeded":
            return await _succeed(
                exe, step, tool, key, status.result, state, "tool.status_resolved"
            )
        if status.state == "failed":
            return await _fail(exe, step, tool, BusinessError(status.error or "failed"), state)
        if status.state == "not_found":
            return _retry_same_key(tool, key, state)
        if state.checks >= MAX_STATUS_CHECKS:
            raise Handover(
                "unknown_outcome",
                f"{tool.name} (key {key}) still pending after {state.checks} checks",
            )
        delay = backoff(tool.retry, state.checks)
        await wait_or_park(
            exe, step, state, delay, ToolError("status pending"), status=StepStatus.UNKNOWN
        )
        return _CHECK
    if tool.idempotency == "provider":
        return _retry_same_key(tool, key, state)
    effect = await exe.store.get_effect(guard_key(step, key))
    if effect is not None and effect.status == "done":
        return await _succeed(exe, step, tool, key, effect.result, state, "tool.effect_found")
    raise Handover(
        "unknown_outcome",
        f"{tool.name} (key {key}) may or may not have happened and has no status check; "
        "check with the provider, then resolve the run by hand",
    )


def guard_key(step: Step, key: str) -> str:
    """The effects-table key of a step: its own key unless the tool shares one."""
    if isinstance(step.input, dict) and isinstance(step.input.get("effect_key"), str):
        return str(step.input["effect_key"])
    return key


def _retry_same_key(tool: Tool, key: str, state: RetryState) -> str:
    state.not_found += 1
    if state.not_found > MAX_SAME_KEY_RETRIES:
        raise Handover(
            "unknown_outcome", f"{tool.name} (key {key}) not found after {state.not_found} retries"
        )
    return _CALL


def _status_context(
    exe: Execution, step: Step, tool: Tool, key: str, state: RetryState
) -> ToolContext:
    ctx = tool_context(exe, step.step_no, key, tool, state.attempts)
    ctx.deadline = time.monotonic() + tool.timeout
    return ctx


async def _succeed(
    exe: Execution, step: Step, tool: Tool, key: str, result: Any, state: RetryState, event: str
) -> ToolOutcome:
    step.status, step.output, step.attempts = StepStatus.SUCCEEDED, result, state.attempts
    step.error_class = step.error = None
    close_duration(step)
    effects = []
    if tool.idempotency == "effects":
        effects.append(
            Effect(
                key=guard_key(step, key),
                run_id=exe.run.id,
                step_no=step.step_no,
                status="done",
                result=result,
            )
        )
    events = take_events(exe)
    if event != "tool.executed" or state.attempts > 1:
        # A plain first-attempt success is recorded by its journal entry alone.
        events.append(
            NewEvent(
                event,
                exe.owner,
                {"tool": tool.name, "key": key, "attempts": state.attempts, "checks": state.checks},
            )
        )
    await exe.record(step, effects=effects, events=events)
    return ToolOutcome(True, result=result)


async def _fail(
    exe: Execution, step: Step, tool: Tool, error: ToolError, state: RetryState
) -> ToolOutcome:
    step.attempts = state.attempts
    effects = []
    if tool.idempotency == "effects":
        # The provider answered with a failure: nothing happened.
        effects.append(
            Effect(
                key=guard_key(step, step.idempotency_key or ""),
                run_id=exe.run.id,
                step_no=step.step_no,
                status="failed",
            )
        )
    return await fail_step(exe, step, error, events=take_events(exe), effects=effects)


async def _wait_for_winner(exe: Execution, step: Step, tool: Tool, winner: Effect) -> ToolOutcome:
    """Another run holds the effect key: wait for its result instead of calling."""
    deadline = time.monotonic() + max(tool.timeout, 1.0) * 3
    while time.monotonic() < deadline:
        current = await exe.store.get_effect(winner.key)
        if current is not None and current.status == "done":
            step.status, step.output = StepStatus.SUCCEEDED, current.result
            step.idempotency_key = None  # the winner's step holds the key
            close_duration(step)
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
        if current is not None and current.status == "failed":
            return await fail_step(
                exe, step, BusinessError(f"{tool.name} failed in {winner.run_id}")
            )
        await asyncio.sleep(0.1)
    raise Handover(
        "unknown_outcome",
        f"{tool.name}: effect {winner.key} held by {winner.run_id} has no result yet",
    )
