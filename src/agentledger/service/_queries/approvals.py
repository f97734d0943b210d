"""The service's approvals: tenant-scoped reads (joined with their run's tenant and user)."""

from __future__ import annotations

from typing import Any

from agentledger._clock import Clock
from agentledger.records import Approval
from agentledger.store import _rows as rows
from agentledger.store._queries.approvals import decide_approval
from agentledger.store._queries.events import insert_event
from agentledger.store._tx import Tx


def tenant_approvals(
    tx: Tx,
    tenant_id: str,
    pending: bool,
    limit: int,
    after: tuple[float, str] | None = None,
) -> list[dict[str, Any]]:
    """Approvals of the tenant's runs (pending ones only when ``pending``), oldest first
    (by ``requested_at``, then id), after the ``(requested_at, id)`` keyset ``after``;
    each with ``approval`` (the record), ``run_user``, ``agent``."""
    where = "r.tenant_id = :t" + (" AND a.decision IS NULL" if pending else "")
    if after is not None:
        where += " AND (a.requested_at > :at OR (a.requested_at = :at AND a.id > :id))"
    found = tx.fetchall(
        "SELECT a.*, r.user_id AS run_user, r.name AS agent FROM approvals a "
        f"JOIN runs r ON r.id = a.run_id WHERE {where} ORDER BY a.requested_at, a.id "
        "LIMIT :limit",
        {
            "t": tenant_id,
            "limit": limit,
            "at": after[0] if after else None,
            "id": after[1] if after else None,
        },
    )
    return [
        {"approval": rows.approval_from(r), "run_user": r["run_user"], "agent": r["agent"]}
        for r in found
    ]


def tenant_approval(tx: Tx, approval_id: str, tenant_id: str) -> dict[str, Any] | None:
    """One approval, only if its run is in ``tenant_id``."""
    found = tx.fetchall(
        "SELECT a.*, r.user_id AS run_user, r.name AS agent FROM approvals a "
        "JOIN runs r ON r.id = a.run_id WHERE a.id = :id AND r.tenant_id = :t",
        {"id": approval_id, "t": tenant_id},
    )
    if not found:
        return None
    r = found[0]
    return {"approval": rows.approval_from(r), "run_user": r["run_user"], "agent": r["agent"]}


def decide_with_context(
    tx: Tx,
    approval_id: str,
    decision: str,
    decided_by: str,
    context: dict[str, Any],
    clock: Clock | None = None,
) -> tuple[Approval, bool]:
    """Decide (see :func:`approvals.decide_approval`; ``clock`` is the deciding side's,
    read while the row is held: a decision at or after expiry raises
    :class:`~agentledger.store._queries.approvals.ApprovalExpired` and records nothing)
    and, only when this call recorded something (the decision, or an approver's vote),
    append its ``approval.decision_context`` event (key, roles, hash, request) in the
    same transaction. Returns (the approval, whether this call recorded it).

    The same decider repeating the decision or vote (a retry, or concurrent duplicates)
    gets the approval back without a second context record, so the audit trail names
    the key that actually decided, once.
    """
    # Lock the row first (PostgreSQL; SQLite has one writer), then read: two concurrent
    # callers cannot both see it undecided.
    tx.execute("UPDATE approvals SET decision = decision WHERE id = :id", {"id": approval_id})
    before = tx.fetchall("SELECT * FROM approvals WHERE id = :id", {"id": approval_id})
    approval = decide_approval(tx, approval_id, decision, decided_by, clock)
    # This call recorded something: the decision, or a vote (an approver of several
    # sending the vote again changes nothing, and records no second context).
    was = rows.approval_from(before[0]) if before else None
    first = (
        was is not None
        and was.decision is None
        and (approval.decision is not None or approval.approvers != was.approvers)
    )
    if first:
        insert_event(tx, approval.run_id, "approval.decision_context", decided_by, context)
    return approval, first
