"""Workers and the versions (targets) they registered."""

from __future__ import annotations

from typing import Any

from agentledger.records import (
    WorkerInfo,
    dumps,
)
from agentledger.store import rows
from agentledger.store.dialect import Dialect


def register_worker(d: Dialect, conn: Any, info: WorkerInfo, kinds: dict[str, str]) -> None:
    now = d.now_sql  # worker liveness is judged by the database's clock, like leases
    d.execute(
        conn,
        "INSERT INTO workers (id, host, pid, targets, started_at, heartbeat_at) VALUES "
        f"(:id, :host, :pid, :targets, {now}, {now}) ON CONFLICT (id) DO UPDATE SET "
        "heartbeat_at = excluded.heartbeat_at",
        {
            "id": info.id,
            "host": info.host,
            "pid": info.pid,
            "targets": dumps(info.targets),
        },
    )
    for target, kind in kinds.items():
        name, version = target.rsplit("@", 1)
        d.execute(
            conn,
            "INSERT INTO registrations (target, name, version, kind, registered_at) VALUES "
            f"(:target, :name, :version, :kind, {now}) ON CONFLICT (target) DO UPDATE SET "
            "registered_at = excluded.registered_at",
            {"target": target, "name": name, "version": version, "kind": kind},
        )


def heartbeat_worker(d: Dialect, conn: Any, worker_id: str) -> None:
    d.execute(
        conn,
        f"UPDATE workers SET heartbeat_at = {d.now_sql} WHERE id = :id",
        {"id": worker_id},
    )


def deregister_worker(d: Dialect, conn: Any, worker_id: str) -> None:
    d.execute(conn, "DELETE FROM workers WHERE id = :id", {"id": worker_id})


def list_workers(d: Dialect, conn: Any, live_within: float | None) -> list[WorkerInfo]:
    if live_within is None:
        found = d.fetchall(conn, "SELECT * FROM workers ORDER BY started_at")
    else:
        found = d.fetchall(
            conn,
            f"SELECT * FROM workers WHERE heartbeat_at > {d.now_sql} - :within ORDER BY started_at",
            {"within": float(live_within)},
        )
    return [rows.worker_from(r) for r in found]


def registrations(d: Dialect, conn: Any) -> list[dict[str, Any]]:
    return d.fetchall(
        conn, "SELECT target, name, version, kind, registered_at FROM registrations ORDER BY target"
    )
