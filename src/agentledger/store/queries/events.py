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


def insert_event(d: Dialect, conn: Any, run_id: str, type: str, actor: str, data: Any) -> None:
    d.execute(
        conn,
        "INSERT INTO events (run_id, at, type, actor, data) VALUES (:run_id, :at, :type, "
        ":actor, :data)",
        {"run_id": run_id, "at": time.time(), "type": type, "actor": actor, "data": dumps(data)},
    )


def list_events(d: Dialect, conn: Any, run_id: str | None, after_id: int) -> list[Event]:
    if run_id is None:
        sql = "SELECT * FROM events WHERE id > :after ORDER BY id LIMIT 1000"
    else:
        sql = "SELECT * FROM events WHERE run_id = :run_id AND id > :after ORDER BY id"
    found = d.fetchall(conn, sql, {"run_id": run_id, "after": after_id})
    return [rows.event_from(r) for r in found]
