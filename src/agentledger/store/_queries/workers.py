"""Workers and the versions (targets) they registered."""

from __future__ import annotations

from typing import Any

from agentledger.records import (
    WorkerInfo,
    dumps,
)
from agentledger.store import _rows as rows
from agentledger.store._tx import Tx


def register_worker(tx: Tx, info: WorkerInfo, kinds: dict[str, str]) -> None:
    now = tx.now  # worker liveness is judged by the database's clock, like leases
    tx.execute(
        "INSERT INTO workers (id, host, pid, targets, started_at, heartbeat_at, draining) "
        f"VALUES (:id, :host, :pid, :targets, {now}, {now}, :draining) ON CONFLICT (id) DO "
        "UPDATE SET heartbeat_at = excluded.heartbeat_at",
        {
            "id": info.id,
            "host": info.host,
            "pid": info.pid,
            "targets": dumps(info.targets),
            "draining": 1 if info.draining else 0,
        },
    )
    for target, kind in kinds.items():
        name, version = target.rsplit("@", 1)
        tx.execute(
            "INSERT INTO registrations (target, name, version, kind, registered_at) VALUES "
            f"(:target, :name, :version, :kind, {now}) ON CONFLICT (target) DO UPDATE SET "
            "registered_at = excluded.registered_at",
            {"target": target, "name": name, "version": version, "kind": kind},
        )


def heartbeat_worker(tx: Tx, worker_id: str) -> None:
    tx.execute(
        f"UPDATE workers SET heartbeat_at = {tx.now} WHERE id = :id",
        {"id": worker_id},
    )


def deregister_worker(tx: Tx, worker_id: str) -> None:
    tx.execute("DELETE FROM workers WHERE id = :id", {"id": worker_id})


def list_workers(tx: Tx, live_within: float | None = None) -> list[WorkerInfo]:
    if live_within is None:
        found = tx.fetchall("SELECT * FROM workers ORDER BY started_at")
    else:
        found = tx.fetchall(
            f"SELECT * FROM workers WHERE heartbeat_at > {tx.now} - :within ORDER BY started_at",
            {"within": float(live_within)},
        )
    return [rows.worker_from(r) for r in found]


def registrations(tx: Tx) -> list[dict[str, Any]]:
    return tx.fetchall(
        "SELECT target, name, version, kind, registered_at FROM registrations ORDER BY target"
    )


_OPEN_STATES = ("queued", "running", "waiting")


def version_counts(tx: Tx) -> list[dict[str, Any]]:
    """Runs per (name, version, kind, status): ``agentledger versions``."""
    return tx.fetchall(
        "SELECT name, version, kind, status, COUNT(*) AS runs FROM runs "
        "GROUP BY name, version, kind, status ORDER BY name, version, status",
    )


def open_runs(tx: Tx, targets: list[str]) -> int:
    """How many runs of ``targets`` are not terminal (queued, running or waiting, parked
    or not): a worker draining its version exits when none is left."""
    if not targets:
        return 0
    names = ", ".join(f":t{i}" for i in range(len(targets)))
    states = ", ".join(f"'{s}'" for s in _OPEN_STATES)
    found = tx.fetchall(
        f"SELECT COUNT(*) AS n FROM runs WHERE status IN ({states}) AND target IN ({names})",
        {f"t{i}": t for i, t in enumerate(targets)},
    )
    return int(found[0]["n"]) if found else 0
