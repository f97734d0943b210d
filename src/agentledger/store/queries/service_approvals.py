"""The service's approvals: tenant-scoped reads (joined with their run's tenant and user)."""

from __future__ import annotations

from typing import Any

from agentledger.store import rows
from agentledger.store.dialect import Dialect


def tenant_approvals(
    d: Dialect, conn: Any, tenant_id: str, pending: bool, limit: int
) -> list[dict[str, Any]]:
    """Approvals of the tenant's runs (pending ones only when ``pending``), oldest first,
    each with ``approval`` (the record), ``run_user``, ``agent``."""
    where = "r.tenant_id = :t" + (" AND a.decision IS NULL" if pending else "")
    found = d.fetchall(
        conn,
        "SELECT a.*, r.user_id AS run_user, r.name AS agent FROM approvals a "
        f"JOIN runs r ON r.id = a.run_id WHERE {where} ORDER BY a.requested_at LIMIT :limit",
        {"t": tenant_id, "limit": limit},
    )
    return [
        {"approval": rows.approval_from(r), "run_user": r["run_user"], "agent": r["agent"]}
        for r in found
    ]


def tenant_approval(
    d: Dialect, conn: Any, approval_id: str, tenant_id: str
) -> dict[str, Any] | None:
    """One approval, only if its run is in ``tenant_id``."""
    found = d.fetchall(
        conn,
        "SELECT a.*, r.user_id AS run_user, r.name AS agent FROM approvals a "
        "JOIN runs r ON r.id = a.run_id WHERE a.id = :id AND r.tenant_id = :t",
        {"id": approval_id, "t": tenant_id},
    )
    if not found:
        return None
    r = found[0]
    return {"approval": rows.approval_from(r), "run_user": r["run_user"], "agent": r["agent"]}
