"""Workers and the versions (targets) they registered."""

from __future__ import annotations

import time
from typing import Any

from agentledger.records import (
    WorkerInfo,
    dumps,
)
from agentledger.store import rows
from agentledger.store.dialect import Dialect


def register_worker(d: Dialect, conn: Any, info: WorkerInfo, kinds: dict[str, str]) -> None:
    now = time.time()
    d.execute(
        conn,
        "INSERT INTO workers (id, host, pid, targets, started_at, heartbeat_at) VALUES "
        "(:id, :host, :pid, :targets, :now, :now) ON CONFLICT (id) DO UPDATE SET "
        "heartbeat_at = excluded.heartbeat_at",
        {
            "id": info.id,
            "host": info.host,
            "pid": info.pid,
            "targets": dumps(info.targets),
            "now": now,
        },
    )
    for target, kind in kinds.items():
        name, version = target.rsplit("@", 1)
        d.execute(
            conn,
            "INSERT INTO registrations (target, name, version, kind, registered_at) VALUES "
            "(:target, :name, :version, :kind, :now) ON CONFLICT (target) DO UPDATE SET "
            "registered_at = excluded.registered_at",
            {"target": target, "name": name, "version": version, "kind": kind, "now": now},
        )


def heartbeat_worker(d: Dialect, conn: Any, worker_id: str) -> None:
    d.execute(
        conn,
        "UPDATE workers SET heartbeat_at = :now WHERE id = :id",
        {"now": time.time(), "id": worker_id},
    )


def deregister_worker(d: Dialect, conn: Any, worker_id: str) -> None:
    d.execute(conn, "DELETE FROM workers WHERE id = :id", {"id": worker_id})


def list_workers(d: Dialect, conn: Any, live_within: float | None) -> list[WorkerInfo]:
    if live_within is None:
        found = d.fetchall(conn, "SELECT * FROM workers ORDER BY started_at")
    else:
        found = d.fetchall(
            conn,
            "SELECT * FROM workers WHERE heartbeat_at > :t ORDER BY started_at",
            {"t": time.time() - live_within},
        )
    return [rows.worker_from(r) for r in found]


def registrations(d: Dialect, conn: Any) -> list[dict[str, Any]]:
    return d.fetchall(
        conn, "SELECT target, name, version, kind, registered_at FROM registrations ORDER BY target"
    )
