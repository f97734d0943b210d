"""Approvals: a proposed action waiting for a human decision."""

from __future__ import annotations

from typing import Any

from agentledger.canonical import clean_text
from agentledger.errors import StoreError
from agentledger.records import (
    Approval,
    dumps,
)
from agentledger.store import rows
from agentledger.store.base import AlreadyDecided
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
    """Record a decision: one atomic UPDATE ... WHERE decision IS NULL, row count checked.

    Exactly one decision wins (a human's and the expiry's racing included). A losing
    different decision raises :class:`AlreadyDecided` naming the winner; the same decider
    repeating the same decision -- a retry, e.g. after a lost COMMIT reply -- gets the
    recorded approval back.
    """
    changed = d.execute(
        conn,
        "UPDATE approvals SET decision = :decision, decided_by = :by, "
        f"decided_at = {d.now_sql} WHERE id = :id AND decision IS NULL",
        {"decision": decision, "by": decided_by, "id": approval_id},
    )
    found = d.fetchall(conn, "SELECT * FROM approvals WHERE id = :id", {"id": approval_id})
    if not found:
        raise StoreError(
            f"no approval {clean_text(approval_id)!r}; list them with `agentledger approvals list`"
        )
    approval = rows.approval_from(found[0])
    if changed == 0:
        if approval.decision == decision and approval.decided_by == clean_text(decided_by):
            return approval  # this decider's own decision, committed before: a retry
        raise AlreadyDecided(approval)
    # The decision re-queues the run: a worker picks it up and reads the decision.
    d.execute(
        conn,
        f"UPDATE runs SET available_at = {d.now_sql}, updated_at = {d.now_sql} "
        "WHERE id = :run_id AND status = 'waiting'",
        {"run_id": approval.run_id},
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
    return approval
