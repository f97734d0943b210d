"""The policy and approval gate in front of a tool call.

Approval is a persisted run state, not a modal: the step is journaled as
``waiting``, an approval row records the proposed action with its
server-computed values, and the run parks until the approval is decided (the
decision re-queues it) or expires (the worker claims it at ``expires_at`` and
applies the declared default, recording it).

Exactly one decision wins (the store decides atomically). When the worker applies
the expiry default and a human decided first, the human's decision is read back
and acted on: a run never fails on "already decided". A cancel request while the
approval is pending closes it (rejected by ``system:cancelled``) and cancels the
run: the proposed call never ran, so there is nothing in flight to resolve.

A policy Deny is journaled with the class ``not_allowed``, which is what the model
is told on the first pass and after any resume.
"""

from __future__ import annotations

from typing import Any

from agentledger._canonical import NotJournalable, canonical_json
from agentledger._policies import (
    Allow,
    Decision,
    Deny,
    ProposedCall,
    RequireApproval,
    run_policy,
)
from agentledger.engine._execution import Execution
from agentledger.engine._signals import Cancelled, Park
from agentledger.engine._steps import ToolOutcome, fail_step
from agentledger.errors import FailureClass, Refused
from agentledger.records import Approval, ApprovalDecision, Step, StepStatus
from agentledger.store._base import NewEvent
from agentledger.store._queries.common import new_id
from agentledger.tools._contract import Tool

EXPIRED_BY = "system:expired"
CANCELLED_BY = "system:cancelled"
_ALLOW = Allow()


class NotAllowed(Refused):
    """A policy denied the call: the model is told ``not_allowed`` and the reason."""

    error_class = FailureClass.NOT_ALLOWED


async def gate(exe: Execution, step: Step, tool: Tool, args: dict[str, Any]) -> ToolOutcome | None:
    """Return None to go ahead, or a failed ToolOutcome; raise Park to wait."""
    if step.status == StepStatus.WAITING:
        return await _decided(exe, step, tool, args)
    decision: Decision = _ALLOW
    if exe.policy is not None:  # no policy allows every call (nothing to propose it to)
        call = ProposedCall(
            run_id=exe.run.id,
            step_no=step.step_no,
            tool=tool.name,
            arguments=args,
            user_id=exe.run.user_id,
            tenant_id=exe.run.tenant_id,
            run_input=exe.run.input,
        )
        decision = await run_policy(exe.policy, call)
    if isinstance(decision, Allow) and tool.approval:
        decision = RequireApproval(role=tool.approval)
    if isinstance(decision, RequireApproval):
        # A held outcome goes in first (a plain write's boundary left it to the write's
        # own entry): its fence reads back a cancel, and nobody is asked to approve a
        # call of a run that was cancelled before it was asked for.
        await exe.durable()
        cancel = exe.cancel_reason()
        if cancel is not None:
            raise Cancelled(cancel)
    # Every decision is in the audit trail: an Allow in the step's journal entry and its
    # ``step.<status>`` record (written with it, at no extra cost per step), the others
    # also as events of their own.
    if isinstance(step.input, dict):
        step.input["policy"] = type(decision).__name__.lower()
    if not isinstance(decision, Allow):
        exe.pending_events.append(
            NewEvent(
                "policy.decision",
                "policy",
                {
                    "tool": tool.name,
                    "step_no": step.step_no,
                    "decision": type(decision).__name__,
                    "detail": getattr(decision, "reason", None) or getattr(decision, "role", None),
                },
            )
        )
    if isinstance(decision, Deny):
        return await fail_step(exe, step, NotAllowed(decision.reason), events=_take(exe))
    if isinstance(decision, RequireApproval):
        now = exe.clock.now()
        approval = Approval(
            id=new_id("a"),
            run_id=exe.run.id,
            step_no=step.step_no,
            tool=tool.name,
            arguments=args,
            required_role=decision.role,
            requested_at=now,
            expires_at=now + decision.expires_in,
            default_decision=decision.default,
            requested_by=exe.run.user_id,
            not_requester=decision.not_requester,
            approvals_needed=decision.approvals_needed,
        )
        step.status = StepStatus.WAITING
        why = f"approval {approval.id} by {decision.role}"
        # The approval row and the run's ``waiting`` state commit together: a decision
        # made right after must find the run waiting, or its re-queue would be lost.
        await exe.record(
            step,
            approvals=[approval],
            park_until=approval.expires_at,
            events=[
                *_take(exe),
                NewEvent("run.parked", exe.owner, {"why": why, "until": approval.expires_at}),
                NewEvent(
                    "approval.requested",
                    exe.owner,
                    {
                        "approval_id": approval.id,
                        "tool": tool.name,
                        "role": decision.role,
                        "arguments": args,
                        "expires_at": approval.expires_at,
                        "not_requester": decision.not_requester,
                        "approvals_needed": decision.approvals_needed,
                    },
                ),
            ],
        )
        raise Park(approval.expires_at, why, committed=True)
    return None


async def _decided(
    exe: Execution, step: Step, tool: Tool, args: dict[str, Any]
) -> ToolOutcome | None:
    found = [a for a in await exe.store.get_approvals(exe.run.id) if a.step_no == step.step_no]
    if not found:
        return None
    approval = found[0]
    if approval.decision is None:
        cancel = exe.cancel_reason()
        if cancel is not None:
            approval = await _decide(exe, approval, ApprovalDecision.REJECT, CANCELLED_BY)
            if approval.decision != ApprovalDecision.APPROVE:
                step.started_at = exe.clock.now()  # the wait is the approval's, not the step's
                await fail_step(
                    exe,
                    step,
                    Refused(f"{tool.name} was not run: the run was cancelled ({cancel})"),
                    events=_take(exe),
                )
                raise Cancelled(cancel)
        elif exe.clock.now() < approval.expires_at:
            raise Park(approval.expires_at, f"approval {approval.id} still pending")
        else:
            approval = await _decide(exe, approval, approval.default_decision, EXPIRED_BY)
    # The step's duration is its own work from here on; the wait for the decision is
    # the approval's (requested_at to decided_at), shown apart (cli/_tables.py).
    step.started_at = exe.clock.now()
    if approval.decision == ApprovalDecision.APPROVE:
        # The decision covers the arguments the approver was shown (the approval row);
        # the call runs with the journaled ones: they must be the same call.
        if _digest(approval.arguments) != _digest(args):
            return await fail_step(
                exe,
                step,
                Refused(f"{tool.name} was not run: its arguments differ from the approved ones"),
                events=_take(exe),
            )
        step.status = StepStatus.NEW
        return None
    return await fail_step(
        exe, step, Refused(f"{tool.name} was rejected by {approval.decided_by}"), events=_take(exe)
    )


async def _decide(exe: Execution, approval: Approval, decision: str, by: str) -> Approval:
    """Decide ``approval`` for the system; if someone else decided first, their decision.

    Exactly one decision wins in the store; the loser's error is not the run's
    failure: the winner's decision is read back and acted on.
    """
    try:
        return await exe.store.decide_approval(approval.id, decision, by)
    except Exception:
        for current in await exe.store.get_approvals(exe.run.id):
            if current.id == approval.id and current.decision is not None:
                return current
        raise  # not decided by anyone: the store itself failed (the run is resumed)


def _digest(value: Any) -> str:
    try:
        return canonical_json(value)
    except NotJournalable:
        return repr(value)


def _take(exe: Execution) -> list[NewEvent]:
    events, exe.pending_events = exe.pending_events, []
    return events
