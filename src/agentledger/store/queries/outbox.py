"""The outbox: side effects delivered later with their own retries."""

from __future__ import annotations

import time
from typing import Any

from agentledger.records import (
    OutboxItem,
    dumps,
)
from agentledger.store import rows
from agentledger.store.dialect import Dialect


def insert_outbox(d: Dialect, conn: Any, item: OutboxItem) -> None:
    now = time.time()
    d.execute(
        conn,
        "INSERT INTO outbox (key, run_id, step_no, tool, payload, attempts, next_attempt_at, "
        "status, created_at, updated_at) VALUES (:key, :run_id, :step_no, :tool, :payload, 0, "
        ":next, 'pending', :now, :now) ON CONFLICT (key) DO NOTHING",
        {
            "key": item.key,
            "run_id": item.run_id,
            "step_no": item.step_no,
            "tool": item.tool,
            "payload": dumps(item.payload),
            "next": item.next_attempt_at or now,
            "now": now,
        },
    )


def claim_outbox(
    d: Dialect, conn: Any, owner: str, limit: int, lease_seconds: float
) -> list[OutboxItem]:
    now = time.time()
    found = d.fetchall(
        conn,
        "SELECT key FROM outbox WHERE status = 'pending' AND next_attempt_at <= :now "
        "AND (lease_expires_at IS NULL OR lease_expires_at < :now) "
        "ORDER BY next_attempt_at LIMIT :limit",
        {"now": now, "limit": limit},
    )
    claimed = []
    for r in found:
        got = d.fetchall(
            conn,
            "UPDATE outbox SET lease_owner = :owner, lease_expires_at = :exp WHERE key = :key "
            "AND (lease_expires_at IS NULL OR lease_expires_at < :now) RETURNING *",
            {"owner": owner, "exp": now + lease_seconds, "key": r["key"], "now": now},
        )
        claimed += [rows.outbox_from(g) for g in got]
    return claimed


def settle_outbox(d: Dialect, conn: Any, item: OutboxItem) -> None:
    d.execute(
        conn,
        "UPDATE outbox SET attempts = :attempts, status = :status, next_attempt_at = :next, "
        "last_error = :err, history = :history, lease_owner = NULL, lease_expires_at = NULL, "
        "updated_at = :now WHERE key = :key",
        {
            "attempts": item.attempts,
            "status": item.status,
            "next": item.next_attempt_at,
            "err": item.last_error,
            "history": dumps(item.history),
            "now": time.time(),
            "key": item.key,
        },
    )


def list_outbox(d: Dialect, conn: Any, status: str | None) -> list[OutboxItem]:
    if status:
        found = d.fetchall(
            conn, "SELECT * FROM outbox WHERE status = :s ORDER BY created_at", {"s": status}
        )
    else:
        found = d.fetchall(conn, "SELECT * FROM outbox ORDER BY created_at")
    return [rows.outbox_from(r) for r in found]
