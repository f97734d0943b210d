"""The append-only audit trail."""

from __future__ import annotations

import time
from typing import Any

from agentledger.records import (
    Event,
    dumps,
)
from agentledger.store import rows
from agentledger.store.dialect import Dialect


def insert_event(
    d: Dialect,
    conn: Any,
    run_id: str,
    type: str,
    actor: str,
    data: Any,
    token: str | None = None,
) -> None:
    """Append an event; ``token`` marks the job that wrote it (see :func:`has_event`)."""
    d.execute(
        conn,
        "INSERT INTO events (run_id, at, type, actor, data, token) VALUES (:run_id, :at, "
        ":type, :actor, :data, :token)",
        {
            "run_id": run_id,
            "at": time.time(),
            "type": type,
            "actor": actor,
            "data": dumps(data),
            "token": token,
        },
    )


def has_event(d: Dialect, conn: Any, run_id: str, token: str) -> bool:
    """True when a job with ``token`` appended an event to the run: the job committed
    before (its reply lost) and must not append it again."""
    found = d.fetchall(
        conn,
        "SELECT 1 AS found FROM events WHERE run_id = :run_id AND token = :token",
        {"run_id": run_id, "token": token},
    )
    return bool(found)


def list_events(d: Dialect, conn: Any, run_id: str | None, after_id: int) -> list[Event]:
    if run_id is None:
        sql = "SELECT * FROM events WHERE id > :after ORDER BY id LIMIT 1000"
    else:
        sql = "SELECT * FROM events WHERE run_id = :run_id AND id > :after ORDER BY id"
    found = d.fetchall(conn, sql, {"run_id": run_id, "after": after_id})
    return [rows.event_from(r) for r in found]
