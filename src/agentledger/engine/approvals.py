"""The policy and approval gate in front of a tool call.

Approval is a persisted run state, not a modal: the step is journaled as
``waiting``, an approval row records the proposed action with its
server-computed values, and the run parks until the approval is decided (the
decision re-queues it) or expires (the worker claims it at ``expires_at`` and
applies the declared default, recording it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from agentledger.engine.execution import Execution
from agentledger.engine.signals import Park
from agentledger.errors import Refused
from agentledger.policies import Allow, Deny, ProposedCall, RequireApproval, decide
from agentledger.records import Approval, Step, StepStatus
from agentledger.store.base import NewEvent
from agentledger.store.queries import new_id
from agentledger.tools.contract import Tool

if TYPE_CHECKING:  # tool_step imports this module; the outcome type is only annotated here
    from agentledger.engine.tool_step import ToolOutcome


async def gate(exe: Execution, step: Step, tool: Tool, args: dict[str, Any]) -> ToolOutcome | None:
    """Return None to go ahead, or a failed ToolOutcome; raise Park to wait."""
    from agentledger.engine.tool_step import fail_step

    if step.status == StepStatus.WAITING:
        return await _decided(exe, step, tool)
    call = ProposedCall(
        run_id=exe.run.id,
        step_no=step.step_no,
        tool=tool.name,
        arguments=args,
        user_id=exe.run.user_id,
        tenant_id=exe.run.tenant_id,
        run_input=exe.run.input,
    )
    decision = await decide(exe.policy, call)
    if isinstance(decision, Allow) and tool.approval:
        decision = RequireApproval(role=tool.approval)
    # Every decision is in the audit trail: an Allow in the step's journal entry
    # (written with it, at no extra cost per step), the others also as events.
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
        outcome: ToolOutcome = await fail_step(
            exe, step, Refused(decision.reason), events=_take(exe)
        )
        outcome.error_class = "not_allowed"
        return outcome
    if isinstance(decision, RequireApproval):
        now = time.time()
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
                    },
                ),
            ],
        )
        raise Park(approval.expires_at, why, committed=True)
    return None


async def _decided(exe: Execution, step: Step, tool: Tool) -> ToolOutcome | None:
    from agentledger.engine.tool_step import fail_step

    found = [a for a in await exe.store.get_approvals(exe.run.id) if a.step_no == step.step_no]
    if not found:
        return None
    approval = found[0]
    decision = approval.decision
    if decision is None:
        if time.time() < approval.expires_at:
            raise Park(approval.expires_at, f"approval {approval.id} still pending")
        approval = await exe.store.decide_approval(
            approval.id, approval.default_decision, "system:expired"
        )
        decision = approval.decision
    if decision == "approve":
        step.status = ""
        return None
    return await fail_step(
        exe, step, Refused(f"{tool.name} was rejected by {approval.decided_by}"), events=_take(exe)
    )


def _take(exe: Execution) -> list[NewEvent]:
    events, exe.pending_events = exe.pending_events, []
    return events
