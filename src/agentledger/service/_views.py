"""JSON views of runs, approvals and events as the API answers them."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentledger._canonical import NotJournalable, canonical_json
from agentledger.records import Approval

TERMINAL_EVENTS = ("run.completed", "run.failed", "run.cancelled", "run.handover", "run.expired")


def arguments_hash(arguments: Any) -> str:
    """SHA-256 of the canonical JSON of an approval's arguments (what a decider saw):
    a decision names it (``POST /v1/approvals/{id}/decision``)."""
    try:
        text = canonical_json(arguments)
    except NotJournalable:
        text = repr(arguments)
    return hashlib.sha256(text.encode()).hexdigest()


def approval_view(a: Approval | None) -> dict[str, Any] | None:
    """An approval with the proposed action, its server-computed arguments and their
    ``arguments_hash`` (what a decision names)."""
    if a is None:
        return None
    return {
        "id": a.id,
        "run_id": a.run_id,
        "step_no": a.step_no,
        "tool": a.tool,
        "arguments": a.arguments,
        "arguments_hash": arguments_hash(a.arguments),
        "required_role": a.required_role,
        "requested_at": a.requested_at,
        "expires_at": a.expires_at,
        "default_decision": a.default_decision,
        "decision": a.decision,
        "decided_by": a.decided_by,
        "decided_at": a.decided_at,
        "not_requester": a.not_requester,
        "approvals_needed": a.approvals_needed,
        "approvers": a.approvers,
    }


def run_view(row: dict[str, Any]) -> dict[str, Any]:
    """A run as ``GET /v1/runs/{id}`` answers it (``row`` from ``service_run``)."""
    run = row["run"]
    return {
        "id": run.id,
        "agent": run.name,
        "version": run.version,
        "kind": run.kind,
        "status": run.status,
        "tenant": run.tenant_id,
        "user": run.user_id,
        "principal": row.get("principal"),
        "step_count": run.step_count,
        "tokens": run.tokens,
        "cost_usd": run.cost_usd,
        "usage_simulated": run.usage_simulated,
        "result": run.result,
        "error": run.error,
        "handover_reason": run.handover_reason,
        "cancel_requested": run.cancel_requested,
        "pending_approval": approval_view(row.get("pending_approval")),
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "links": links(run.id),
    }


class RunView(BaseModel):
    """A run as ``GET /v1/runs/{id}`` answers it: the schema ``/openapi.json`` publishes
    for :func:`run_view` (the answer is built as a dict; a test holds the two to the same
    fields)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    agent: str = Field(description="The agent's or workflow's name.")
    version: str
    kind: str = Field(description="agent or workflow.")
    status: str = Field(
        description="queued, running, waiting, completed, failed, cancelled, expired or "
        "needs_human."
    )
    tenant: str
    user: str | None
    principal: dict[str, Any] | None = Field(
        description="The key that started the run: key_id, tenant_id, user_id, roles."
    )
    step_count: int
    tokens: int = Field(description="Tokens the run's model steps used.")
    cost_usd: float = Field(description="What the run's model steps cost, in US dollars.")
    usage_simulated: bool = Field(
        default=False,
        description="true: tokens and cost_usd were simulated (an offline scripted model "
        "answered a model step): no provider counted or billed them.",
    )
    result: Any = Field(description="The result, once completed.")
    error: str | None
    handover_reason: str | None = Field(description="Why a needs_human run was handed over.")
    cancel_requested: str | None = Field(description="The reason of a pending cancel.")
    pending_approval: dict[str, Any] | None = Field(
        description="The approval the run waits for, with its arguments_hash."
    )
    created_at: float = Field(description="Unix time, seconds.")
    updated_at: float = Field(description="Unix time, seconds.")
    links: dict[str, str] = Field(description="Where to follow the run.")


def links(run_id: str) -> dict[str, str]:
    """Where to follow a run."""
    base = f"/v1/runs/{run_id}"
    return {
        "self": base,
        "result": f"{base}/result",
        "events": f"{base}/events",
        "steps": f"{base}/steps",
    }
