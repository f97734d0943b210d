"""The service's runs as a tenant reads them: one run, a filtered list, a journal.

Accepting a run (quota, Idempotency-Key, the rows it writes) is
:mod:`agentledger.service._accepting`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentledger.store import _rows as rows
from agentledger.store._queries.common import RUN_COLUMNS, status_literal
from agentledger.store._tx import Tx

SERVICE_RUN_COLUMNS = RUN_COLUMNS + ", webhook, idempotency_key, event_seq"


def service_run(tx: Tx, run_id: str, tenant_id: str) -> dict[str, Any] | None:
    """The run row with its service columns and pending approval, in ``tenant_id`` only."""
    found = tx.fetchall(
        f"SELECT {SERVICE_RUN_COLUMNS} FROM runs WHERE id = :id AND tenant_id = :t",
        {"id": run_id, "t": tenant_id},
    )
    if not found:
        return None
    return _with_approval(tx, found[0])


def _with_approval(tx: Tx, row: dict[str, Any]) -> dict[str, Any]:
    data = dict(row)
    data["run"] = rows.run_from(row)
    data["principal"] = json.loads(row["principal"]) if row.get("principal") else None
    pending = tx.fetchall(
        "SELECT * FROM approvals WHERE run_id = :id AND decision IS NULL ORDER BY step_no",
        {"id": row["id"]},
    )
    data["pending_approval"] = rows.approval_from(pending[0]) if pending else None
    return data


@dataclass
class RunFilter:
    """``GET /v1/runs`` filters; ``cursor`` is (created_at, id) of the last row seen."""

    tenant_id: str
    status: str | None = None
    agent: str | None = None
    version: str | None = None
    user: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    waiting_approval: bool | None = None
    needs_human: bool | None = None
    cursor: tuple[float, str] | None = None
    limit: int = 50


def run_where(
    tenant_id: str,
    *,
    status: str | None = None,
    agent: str | None = None,
    version: str | None = None,
    user: str | None = None,
    created_after: float | None = None,
    created_before: float | None = None,
    cursor: tuple[float, str] | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """The clauses of a tenant's runs list that the API and the console share: one stored
    state (a literal: see :func:`status_literal`), agent, version, user, a time range and
    the keyset cursor (created_at, id) of the last row seen."""
    where = ["tenant_id = :tenant"]
    params: dict[str, Any] = {"tenant": tenant_id}
    if status is not None:
        where.append(f"status = {status_literal(status)}")
    for column, value in (("name", agent), ("version", version), ("user_id", user)):
        if value is not None:
            where.append(f"{column} = :{column}")
            params[column] = value
    if created_after is not None:
        where.append("created_at >= :after")
        params["after"] = created_after
    if created_before is not None:
        where.append("created_at < :before")
        params["before"] = created_before
    if cursor is not None:
        where.append("(created_at < :c_at OR (created_at = :c_at AND id < :c_id))")
        params["c_at"], params["c_id"] = cursor
    return where, params


def list_service_runs(tx: Tx, f: RunFilter) -> list[dict[str, Any]]:
    """Runs of one tenant, newest first, after ``f.cursor``."""
    where, params = run_where(
        f.tenant_id,
        status=f.status,
        agent=f.agent,
        version=f.version,
        user=f.user,
        created_after=f.created_after,
        created_before=f.created_before,
        cursor=f.cursor,
    )
    params["limit"] = f.limit
    pending = "EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = runs.id AND a.decision IS NULL)"
    if f.waiting_approval is not None:
        where.append(pending if f.waiting_approval else f"NOT {pending}")
    if f.needs_human is not None:
        where.append("status = 'needs_human'" if f.needs_human else "status <> 'needs_human'")
    sql = (
        f"SELECT {SERVICE_RUN_COLUMNS} FROM runs WHERE {' AND '.join(where)} "
        "ORDER BY created_at DESC, id DESC LIMIT :limit"
    )
    return [_with_approval(tx, r) for r in tx.fetchall(sql, params)]


def run_steps(tx: Tx, run_id: str) -> list[dict[str, Any]]:
    """The journal of a run as rows (JSON columns decoded)."""
    found = tx.fetchall("SELECT * FROM steps WHERE run_id = :id ORDER BY step_no", {"id": run_id})
    return [rows.step_from(r).to_dict() for r in found]
