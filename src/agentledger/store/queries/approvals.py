"""Approvals: a proposed action waiting for a human decision."""

from __future__ import annotations

import time
from typing import Any

from agentledger.errors import StoreError
from agentledger.records import (
    Approval,
    dumps,
)
from agentledger.store import rows
from agentledger.store.dialect import Dialect
from agentledger.store.queries.events import insert_event


def insert_approval(d: Dialect, conn: Any, a: Approval) -> None:
    d.execute(
        conn,
        "INSERT INTO approvals (id, run_id, step_no, tool, arguments, required_role, "
        "requested_at, expires_at, default_decision) VALUES (:id, :run_id, :step_no, :tool, "
        ":arguments, :role, :requested_at, :expires_at, :default) "
        "ON CONFLICT (run_id, step_no) DO NOTHING",
        {
            "id": a.id,
            "run_id": a.run_id,
            "step_no": a.step_no,
            "tool": a.tool,
            "arguments": dumps(a.arguments),
            "role": a.required_role,
            "requested_at": a.requested_at,
            "expires_at": a.expires_at,
            "default": a.default_decision,
        },
    )


def get_approvals(d: Dialect, conn: Any, run_id: str | None, pending: bool) -> list[Approval]:
    where, params = [], {}
    if run_id:
        where.append("run_id = :run_id")
        params["run_id"] = run_id
    if pending:
        where.append("decision IS NULL")
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    found = d.fetchall(conn, f"SELECT * FROM approvals {clause} ORDER BY requested_at", params)
    return [rows.approval_from(r) for r in found]


def decide_approval(
    d: Dialect, conn: Any, approval_id: str, decision: str, decided_by: str
) -> Approval:
    found = d.fetchall(conn, "SELECT * FROM approvals WHERE id = :id", {"id": approval_id})
    if not found:
        raise StoreError(f"no approval {approval_id}; list them with `agentledger approvals list`")
    approval = rows.approval_from(found[0])
    if approval.decision is not None:
        raise StoreError(f"approval {approval_id} was already decided: {approval.decision}")
    now = time.time()
    d.execute(
        conn,
        "UPDATE approvals SET decision = :decision, decided_by = :by, decided_at = :now "
        "WHERE id = :id AND decision IS NULL",
        {"decision": decision, "by": decided_by, "now": now, "id": approval_id},
    )
    # The decision re-queues the run: a worker picks it up and reads the decision.
    d.execute(
        conn,
        "UPDATE runs SET available_at = :now, updated_at = :now WHERE id = :run_id "
        "AND status = 'waiting'",
        {"now": now, "run_id": approval.run_id},
    )
    d.notify_runnable(conn)
    insert_event(
        d,
        conn,
        approval.run_id,
        "approval.decided",
        decided_by,
        {"approval_id": approval_id, "decision": decision, "tool": approval.tool},
    )
    approval.decision, approval.decided_by, approval.decided_at = decision, decided_by, now
    return approval
