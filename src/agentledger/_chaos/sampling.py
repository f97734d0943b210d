"""What ``agentledger soak`` samples every few seconds: the workers' memory (from
``/proc``) and, in one read transaction, the figures of the interval from the database.

A sample's latencies are of the steps that *started* in the interval; its queue delay is
from a run's submit to its first claim, for the runs first claimed in the interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentledger.records import RunStatus
from agentledger.store import Tx

STUCK_GRACE = 30.0
"""Seconds past its lease's expiry after which a running run nobody took over is stuck."""

COLUMNS: tuple[str, ...] = (
    "t_s",
    "utc",
    "workers",
    "rss_total_mb",
    "rss_max_mb",
    "rss_workers_mb",
    "rss_soak_mb",
    "submitted",
    "completed_per_s",
    "steps",
    "step_p50_ms",
    "step_p95_ms",
    "step_p99_ms",
    "submit_p50_ms",
    "queue_delay_p50_s",
    "queue_delay_p95_s",
    "queue_depth",
    "waiting",
    "stuck",
    "db_bytes",
    "outbox_dead",
    "kills",
    "pg_restarts",
    "approvals_decided",
)
"""The CSV's columns, in order (``rss_workers_mb``: each live worker's RSS, by pid;
``rss_soak_mb``: the command's own, which holds every side effect its proxies counted)."""


def rss_mb(pid: int) -> float | None:
    """The resident memory of process ``pid`` in MB (None: gone, or no ``/proc``)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of ``values``, None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class DbSample:
    """The database's figures of one interval."""

    by_status: dict[str, int]
    step_ms: list[float]
    queue_delays: list[float]
    stuck: int
    db_bytes: int
    outbox_dead: int

    def terminal(self) -> int:
        return sum(n for s, n in self.by_status.items() if s in RunStatus.TERMINAL)


def _one(tx: Tx, sql: str, params: dict[str, Any] | None = None) -> int:
    found = tx.fetchall(sql, params or {})
    return int(found[0]["n"] or 0) if found else 0


def sample_db(tx: Tx, since: float, lease_seconds: float, start: float) -> DbSample:
    """The interval from ``since`` (wall clock) to now, read in one transaction; the
    runs counted are those submitted from ``start`` on (a database may hold others)."""
    by_status = {
        r["status"]: int(r["n"])
        for r in tx.fetchall(
            "SELECT status, COUNT(*) AS n FROM runs WHERE created_at >= :start GROUP BY status",
            {"start": start},
        )
    }
    step_ms = [
        float(r["duration_ms"])
        for r in tx.fetchall(
            "SELECT duration_ms FROM steps WHERE started_at >= :since AND duration_ms IS NOT NULL",
            {"since": since},
        )
    ]
    # Runs submitted long before the interval were claimed before it, or are counted by
    # the queue depth: the window keeps the scan to the recent runs.
    claims = tx.fetchall(
        "SELECT r.created_at AS created, MIN(e.at) AS claimed FROM runs r "
        "JOIN events e ON e.run_id = r.id AND e.type = 'run.claimed' "
        "WHERE r.created_at >= :recent AND r.created_at >= :start "
        "GROUP BY r.id, r.created_at HAVING MIN(e.at) >= :since",
        {"since": since, "recent": since - 600.0, "start": start},
    )
    stuck = _one(
        tx,
        "SELECT COUNT(*) AS n FROM runs WHERE status = 'running' AND created_at >= :start "
        f"AND lease_expires_at < {tx.now} - :grace",
        {"grace": lease_seconds + STUCK_GRACE, "start": start},
    )
    if tx.dialect.name == "postgres":
        db_bytes = _one(tx, "SELECT pg_database_size(current_database()) AS n")
    else:
        pages = tx.fetchall("PRAGMA page_count")
        size = tx.fetchall("PRAGMA page_size")
        db_bytes = int(next(iter(pages[0].values()))) * int(next(iter(size[0].values())))
    return DbSample(
        by_status,
        step_ms,
        [float(r["claimed"]) - float(r["created"]) for r in claims],
        stuck,
        db_bytes,
        _one(tx, "SELECT COUNT(*) AS n FROM outbox WHERE status = 'dead'"),
    )


def worker_rss(pids: Iterable[int]) -> dict[int, float]:
    """Each live process's RSS in MB, by pid."""
    found = {pid: rss_mb(pid) for pid in pids}
    return {pid: mb for pid, mb in found.items() if mb is not None}


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, value) points, per hour (0 with fewer than 2)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mx) * (v - my) for t, v in points) / var * 3600
