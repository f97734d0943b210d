"""Compensation: undo earlier effects when a run ends without completing.

When a run is headed for ``failed``, ``cancelled`` or a handover, the decision is
journaled first -- a ``decision`` step holding the terminal status it is heading
to, why, and the plan: which succeeded write steps are owed a compensation
(newest first) and at which step number each compensation runs. A resumed run
that finds the decision goes straight back to compensating; it never has to
re-derive the failure. The decision's batch drops the run's undelivered outbox
rows (a "booking confirmed" email must not follow a cancelled booking).

Compensations are durable steps like any other (``kind="compensation"``): keyed,
retried by class, parked for a long backoff, status-checked when their outcome
is unknown. One that cannot be settled -- it failed, its arguments could not be
built, or its outcome stays unknown -- hands the run to a human with the reason
(:class:`~agentledger.engine._signals.Handover`), never a terminal state with
money taken.

A failed compensation a person resumed (marked ``recheck`` by the resume, when its tool
had a status check) is asked about at the provider first: applied -> recorded done and
never called; not applied -> called again with its key; no answer -> not called, the
run goes back to a person (:func:`_recheck`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentledger.engine import _inflight as inflight
from agentledger.engine._execution import Execution
from agentledger.engine._retries import RetryState
from agentledger.engine._signals import Handover, HandoverReason
from agentledger.engine._steps import fail_step, new_step, take_events
from agentledger.engine._tool_step import run_tool_step
from agentledger.engine._unknown import WriteAttempts
from agentledger.errors import ToolError
from agentledger.records import Step, StepStatus
from agentledger.store._base import NewEvent
from agentledger.tools._status import Status

DECISION_KIND = "decision"
DECISION_NAME = "compensate"


@dataclass
class CompensationDecision:
    """Where a run is heading once its compensations are done."""

    status: str
    error: str | None = None
    handover_reason: str | None = None
    event: str = "run.failed"
    data: dict[str, Any] = field(default_factory=dict)
    plan: list[list[int]] = field(default_factory=list)  # [step owed, compensation step]

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "handover_reason": self.handover_reason,
            "event": self.event,
            "data": self.data,
            "plan": self.plan,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompensationDecision:
        return cls(
            status=data["status"],
            error=data.get("error"),
            handover_reason=data.get("handover_reason"),
            event=data.get("event", "run.failed"),
            data=dict(data.get("data") or {}),
            plan=[list(p) for p in data.get("plan", [])],
        )


def journaled_decision(exe: Execution) -> CompensationDecision | None:
    """The decision to compensate, if the journal holds one (the run is compensating)."""
    for step in exe.journal.values():
        if step.kind == DECISION_KIND and isinstance(step.output, dict):
            return CompensationDecision.from_dict(step.output)
    return None


def owed(exe: Execution) -> list[Step]:
    """Write steps that took effect and declare a compensation, newest first.

    A write that succeeded but whose result could not be journaled took effect
    too: it is owed its compensation (whose arguments then cannot be built, which
    hands the run to a human rather than leaving the effect unaccounted for).
    """
    steps = []
    for step in sorted(exe.journal.values(), key=lambda s: s.step_no, reverse=True):
        tool = exe.tools.get(step.name)
        if (
            step.kind == "tool"
            and step.took_effect()
            and tool is not None
            and tool.compensation is not None
            and step.idempotency_key is not None
        ):
            steps.append(step)
    return steps


async def plan_compensation(exe: Execution, decision: CompensationDecision) -> CompensationDecision:
    """Journal ``decision`` with its compensation plan; return it.

    Nothing owed: nothing is journaled (the run finishes at once, no resume needed).
    """
    targets = owed(exe)
    if not targets:
        return decision
    first = max(exe.journal, default=0) + 1
    decision.plan = [[t.step_no, first + 1 + i] for i, t in enumerate(targets)]
    step = new_step(exe, first, DECISION_KIND, DECISION_NAME, status=StepStatus.SUCCEEDED)
    step.output = decision.to_dict()
    await exe.record(
        step,
        drop_outbox=True,
        events=[
            NewEvent(
                "run.compensating",
                exe.owner,
                {"heading_to": decision.status, "owed": [t for t, _ in decision.plan]},
            )
        ],
    )
    return decision


async def compensate(exe: Execution, decision: CompensationDecision) -> list[int]:
    """Run the compensations of ``decision``'s plan still owed; return the steps undone.

    Raises Park (a compensation waits: the run parks and resumes here) or Handover
    (one could not be settled; the others were still attempted first).
    """
    exe.compensating = True
    failures: list[str] = []
    compensated: list[int] = []
    for target_no, comp_no in decision.plan:
        target = exe.journal[target_no]
        tool = exe.tools.get(target.name)
        comp = tool.compensation if tool is not None else None
        existing = exe.journal.get(comp_no)
        # A compensation that happened (its result journaled or not) is never called
        # again: a resumed pass counts it as done.
        if existing is not None and existing.took_effect():
            compensated.append(target_no)
            continue
        if existing is not None and existing.status == StepStatus.FAILED:
            if not owes_recheck(existing):
                failures.append(_failure(target, existing.name, existing.error))
                continue
            # A person resumed the run: ask the provider before calling it again.
            unsettled = await _recheck(exe, existing, target)
            if unsettled is not None:
                failures.append(unsettled)
                continue
            existing = exe.journal.get(comp_no)
            if existing is not None and existing.took_effect():
                await exe.event(
                    "compensation.done",
                    {"step_no": target_no, "tool": existing.name, "by_step": comp_no,
                     "error": None},
                )  # fmt: skip
                compensated.append(target_no)
                continue
        if comp is None:  # the code lost the compensation under the run
            failures.append(_failure(target, "?", "its tool no longer declares a compensation"))
            continue
        if existing is None:
            try:
                args = comp.arguments(
                    target.input.get("args", {}) if isinstance(target.input, dict) else {},
                    target.output,
                )
            except Exception as exc:
                error = f"could not build its arguments: {type(exc).__name__}: {exc}"
                step = new_step(exe, comp_no, "compensation", comp.tool, status=StepStatus.NEW)
                step.input = {"compensates": target_no}
                await fail_step(exe, step, ToolError(error))
                failures.append(_failure(target, comp.tool, error))
                continue
        else:
            args = {}  # in flight: run_tool_step resumes with the journaled arguments
        # Its journaled key, never one made again (a journal of another version may hold
        # another format): the provider knows the compensation by the key it was sent.
        key = existing.idempotency_key if existing is not None else None
        try:
            outcome = await run_tool_step(
                exe, comp_no, comp.tool, args, kind="compensation", key=key,
                compensates=target_no,
            )  # fmt: skip
        except Handover as stuck:  # its outcome stays unknown: a human settles it
            failures.append(_failure(target, comp.tool, stuck.detail))
            continue
        # As the journal states it, so a resumed run judges it the same way.
        entry = exe.journal.get(comp_no)
        ok = entry is not None and entry.status == StepStatus.SUCCEEDED
        reason = outcome.error if entry is None else entry.error
        await exe.event(
            "compensation.done" if ok else "compensation.failed",
            {"step_no": target_no, "tool": comp.tool, "by_step": comp_no, "error": reason},
        )
        if ok:
            compensated.append(target_no)
        else:
            failures.append(_failure(target, comp.tool, reason))
    if failures:
        raise Handover(
            HandoverReason.COMPENSATION, "compensation could not be settled: " + "; ".join(failures)
        )
    return compensated


def owes_recheck(step: Step) -> bool:
    """Whether a failed compensation is to be status-checked before it is called again:
    an operator's resume marked it (``recheck``, observe/_queries/resume.py) and no pass
    has asked the provider since. The mark is spent by the first answer journaled, so a
    run that parks and is claimed again never calls a failed compensation on its own."""
    recheck = step.input.get("recheck") if isinstance(step.input, dict) else None
    return isinstance(recheck, dict) and "answer" not in recheck


async def _recheck(exe: Execution, step: Step, target: Step) -> str | None:
    """Ask the provider whether a failed compensation took effect after all (its answer
    reported a failure after applying, or the provider does not dedupe keys), with the
    tool's one status check (:meth:`WriteAttempts.check`), before calling it again.

    Applied: journaled succeeded with the provider's result (``tool.status_resolved``);
    None is returned and it is never called. Not applied (``not_found``, or the provider
    holds the key as failed): the step is owed a call with its own key (``retrying``;
    the write path journals ``started`` before calling); None. The check cannot tell
    (``pending``, it raised or timed out, or the tool has no status check now): nothing
    is called, the answer is journaled with the step (still ``failed``) and the failure
    to report is returned, saying what a person does.
    """
    run_id, comp_no = exe.run.id, step.step_no
    async with inflight.exclusive((run_id, comp_no)) as fresh:
        if not fresh:  # another execution of this run got here first: go by its journal
            for found in await exe.store.load_journal(run_id):
                if found.step_no == comp_no:
                    exe.journal[comp_no] = step = found
            if step.status != StepStatus.FAILED or not owes_recheck(step):
                return (
                    None
                    if step.status != StepStatus.FAILED
                    else _failure(target, step.name, step.error)
                )
        tool = exe.tools.get(step.name)
        key = step.idempotency_key or exe.key(comp_no)
        args = step.input.get("args") if isinstance(step.input, dict) else None
        recheck = dict(step.input["recheck"])
        why: str
        status: Status | None = None
        if tool is None or tool.status_check is None or not isinstance(args, dict):
            why = f"its tool {step.name!r} has no status check now"
            history: list[str] = []
        else:
            ops = WriteAttempts(exe, step, tool, args, key)
            ops.state = RetryState()
            answered = await ops.check()
            history = ops.state.history
            if isinstance(answered, Status):
                status = answered
            else:  # a check answering nonsense could not tell (as retries._resolve)
                history.append("status_check:not_a_status")
            why = "the status check " + (
                f"could not ask ({', '.join(history)})" if history else "answered pending"
            )
        answer = (
            "unknown"
            if status is None or status.state not in ("succeeded", "not_found", "failed")
            else "applied"
            if status.state == "succeeded"
            else "not_applied"
        )
        step.input["recheck"] = {**recheck, "answer": answer, "at_check": exe.clock.now()}
        exe.pending_events.append(
            NewEvent(
                "compensation.rechecked",
                exe.owner,
                {"step_no": comp_no, "tool": step.name, "key": key, "answer": answer,
                 "compensates": target.step_no, "history": history},
            )
        )  # fmt: skip
        if answer == "applied":
            assert status is not None and tool is not None and isinstance(args, dict)
            ops.state.maybe_applied = False
            await ops.succeeded(status.result, "status_resolved")
            return None
        if answer == "not_applied":
            # Owed a call with its own key: the write path journals ``started`` (with
            # this answer) before it calls, so a crash in between is found in flight
            # and status-checked again, never called blind.
            step.status, step.output = StepStatus.RETRYING, {"retry": {}}
            step.error_class = step.error = None
            return None
        await exe.record(step, events=take_events(exe))
        return _failure(
            target,
            step.name,
            f"it failed earlier and {why}, so it was not called again (key {key}); look at "
            f"the provider: if it applied, `agentledger runs settle {run_id} {comp_no} "
            f"--applied --result JSON --reason R`, if not, `agentledger runs settle {run_id} "
            f"{comp_no} --not-applied --reason R` (or resume again to check again); then "
            f"`agentledger runs resume {run_id}`",
        )


def _failure(target: Step, comp_tool: str, error: str | None) -> str:
    return f"{comp_tool} for step {target.step_no} ({target.name}): {error or 'failed'}"


__all__ = [
    "CompensationDecision",
    "compensate",
    "journaled_decision",
    "owed",
    "owes_recheck",
    "plan_compensation",
]
