"""JSON views of runs, approvals and events as the API answers them."""

from __future__ import annotations

import hashlib
from typing import Any

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
        "result": run.result,
        "error": run.error,
        "handover_reason": run.handover_reason,
        "cancel_requested": run.cancel_requested,
        "pending_approval": approval_view(row.get("pending_approval")),
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "links": links(run.id),
    }


def links(run_id: str) -> dict[str, str]:
    """Where to follow a run."""
    base = f"/v1/runs/{run_id}"
    return {
        "self": base,
        "result": f"{base}/result",
        "events": f"{base}/events",
        "steps": f"{base}/steps",
    }
