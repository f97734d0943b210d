"""One tool step, per the step protocol (docs/architecture.md, "One step"): this is
where a tool call is journaled.

1. The journal says step n succeeded (or failed for good): return that.
2. Validate the proposed arguments; compute the server's arguments.
3. Policy: allow, deny (``not_allowed``) or park for approval.
4. Outbox tools: write the outbox row with the journal entry and return.
5. Writes: journal ``started`` with the key (and claim the effect key when the
   effects table guards the tool) *before* calling.
6. Call with ``min(tool timeout, time left)``; retry by failure class.
7. Journal the outcome; it is committed before the next step begins.

A write that timed out, or a ``started`` write found on resume, has an unknown
outcome and is resolved by :mod:`agentledger.engine._unknown`, never by a blind
second call. Reads and writes share one attempt loop
(:func:`agentledger.engine._retries.run_attempts`). Within one process a step is
never attempted twice at once (:mod:`agentledger.engine._inflight`).
"""

from __future__ import annotations

import json
from typing import Any

from agentledger._canonical import NotJournalable, journal_value
from agentledger.engine import _approvals as approval_gate
from agentledger.engine import _hooks as hooks
from agentledger.engine import _inflight as inflight
from agentledger.engine._execution import Execution, carries_held
from agentledger.engine._retries import RetryState, as_tool_error, call_with_timeout, run_attempts
from agentledger.engine._signals import Cancelled, Handover, HandoverReason
from agentledger.engine._steps import (
    StepAttempts,
    ToolOutcome,
    close_duration,
    fail_step,
    new_step,
    take_events,
    tool_context,
)
from agentledger.engine._unknown import drive_write
from agentledger.errors import InvalidArguments, Refused
from agentledger.records import OutboxItem, Step, StepStatus
from agentledger.store._base import NewEvent, OutboxKeyTaken
from agentledger.tools._contract import Tool

_REPLAYABLE = {StepStatus.SUCCEEDED, StepStatus.FAILED}
_IN_FLIGHT = {StepStatus.STARTED, StepStatus.UNKNOWN, StepStatus.RETRYING}


def _replay(step: Step) -> ToolOutcome:
    if step.status == StepStatus.SUCCEEDED:
        return ToolOutcome(True, result=step.output)
    return ToolOutcome(False, error_class=step.error_class, error=step.error)


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
        hooks.replayed_step(exe, prior)  # spans (hooks.py): marked replayed, no usage
        return _replay(prior)
    key = key or exe.key(step_no)
    step = prior or new_step(exe, step_no, kind, name, status=StepStatus.NEW)
    tool = exe.tools.get(name)
    if tool is None:
        known = ", ".join(sorted(exe.tools)) or "none"
        return await fail_step(
            exe, step, InvalidArguments(f"unknown tool {name!r}; tools: {known}")
        )
    if not carries_held(tool):
        # This step runs something before its own journal write: a held outcome first.
        await exe.durable()
    if prior is not None and prior.status in _IN_FLIGHT | {StepStatus.WAITING}:
        args = prior.input["args"]
        if prior.status == StepStatus.RETRYING and kind != "compensation":
            await _cancel_before_retry(exe, prior, tool)
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
        return await run_attempts(StepAttempts(exe, step, tool, args, key))

    return await drive_write(exe, step, tool, args, key)


async def _cancel_before_retry(exe: Execution, step: Step, tool: Tool) -> None:
    """A cancel found while a step waits out a backoff is honoured before calling again
    when no earlier attempt may have applied (the step is settled as not run)."""
    cancel = exe.cancel_reason()
    retry = step.output.get("retry") if isinstance(step.output, dict) else None
    if cancel is None or RetryState.from_dict(retry).maybe_applied:
        return  # no cancel, or a same-key resend is owed to settle an unknown outcome
    step.attempts = RetryState.from_dict(retry).attempts
    await fail_step(
        exe,
        step,
        Refused(f"{tool.name} was not called again: the run was cancelled ({cancel})"),
        events=take_events(exe),
    )
    raise Cancelled(cancel)


async def _prepare(
    exe: Execution, step: Step, tool: Tool, raw_args: dict[str, Any] | str, key: str
) -> dict[str, Any] | ToolOutcome:
    """Parse and validate the model's arguments; fill the server's."""
    if isinstance(raw_args, str):
        try:
            raw_args = json.loads(raw_args, parse_constant=_no_constant) if raw_args.strip() else {}
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
    try:
        # What is called is what the journal holds (and what a resume calls again with).
        args = journal_value(args)
    except NotJournalable as exc:
        step.input = {"refused": repr(args)[:500]}
        return await fail_step(
            exe, step, InvalidArguments(f"arguments for {tool.name} are not JSON: {exc}")
        )
    step.input = {"args": args}
    if ignored:
        step.input["ignored_model_args"] = ignored
    exe.pending_events.extend(events)
    return args


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity; JSON (and the journal) has neither.
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


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
    try:
        await exe.record(
            step,
            outbox=[item],
            events=[
                *take_events(exe),
                NewEvent("outbox.enqueued", exe.owner, {"tool": tool.name, "key": outbox_key}),
            ],
        )
    except OutboxKeyTaken as taken:
        # The tool's key is not unique per run: a fault of its definition, not of this
        # run. Nothing was written; a human fixes ``outbox_key`` and resumes the run
        # (this step is then decided again), or cancels it.
        raise Handover(HandoverReason.OUTBOX_KEY, str(taken)) from None
    return ToolOutcome(True, result=step.output)


__all__ = ["run_tool_step"]
