"""Stuck runs: non-terminal runs that make no progress, found on the database's clock.

A run is stuck when (docs/architecture.md, "Stuck runs"):

- ``no_progress``: it is running and nothing was journaled (no batch, no claim) for its
  agent's threshold, or it is queued/waiting, due, and nobody claimed it for that long;
- ``takeovers``: its lease was taken over ``takeovers`` times or more (a crash loop);
- ``no_worker``: it is queued and due, and no live worker has its version.

A run parked until a future time (an approval that has not expired, a backoff, a sleep)
is not stuck: its clock starts when it becomes due. Reporting is once per episode: the
mark (reason and the time the episode began) is written with a guarded UPDATE, and only
the writer that changed it appends the ``run.stuck`` event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentledger.store._queries.events import insert_event
from agentledger.store._tx import Tx

STUCK_EVENT = "run.stuck"


@dataclass
class StuckRun:
    """One stuck run and why."""

    run_id: str
    name: str
    version: str
    tenant_id: str
    status: str
    reason: str  # no_progress | takeovers | no_worker
    since: float  # when the run last made progress (database clock, UNIX seconds)
    idle_seconds: float
    resumes: int
    reported: bool  # its run.stuck event for this episode is already written

    @property
    def mark(self) -> str:
        """The episode's identity: a new episode starts with new progress."""
        return f"{self.reason}:{self.since:.6f}"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def find_stuck(
    tx: Tx,
    default_after: float,
    per_agent: dict[str, float],
    takeovers: int,
    live_within: float,
) -> list[StuckRun]:
    """The stuck runs now. ``per_agent``: threshold (seconds) by agent/workflow name."""
    now = tx.now
    least = min([default_after, *per_agent.values()])
    workers = tx.fetchall(
        f"SELECT targets FROM workers WHERE heartbeat_at > {now} - :live",
        {"live": float(live_within)},
    )
    serving: set[str] = set()
    for row in workers:
        targets = row["targets"]
        serving.update(json.loads(targets) if isinstance(targets, str) else targets or [])
    # The clock of a run starts at its last write or claim, or when it became due.
    found = tx.fetchall(
        "SELECT id, name, version, target, tenant_id, status, resumes, stuck_mark, "
        "CASE WHEN status <> 'running' AND available_at > updated_at THEN available_at "
        f"ELSE updated_at END AS since, {now} AS now FROM runs "
        "WHERE status IN ('queued', 'running', 'waiting') AND ("
        f"(CASE WHEN status <> 'running' AND available_at > updated_at THEN available_at "
        f"ELSE updated_at END) < {now} - :least OR resumes >= :takeovers "
        f"OR (status = 'queued' AND available_at <= {now} - :grace))",
        {"least": float(least), "takeovers": int(takeovers), "grace": min(least, live_within)},
    )
    stuck = []
    for row in found:
        since, at = float(row["since"]), float(row["now"])
        idle = at - since
        after = per_agent.get(row["name"], default_after)
        if idle >= after:
            reason = "no_progress"
            if row["status"] == "queued" and row["target"] not in serving:
                reason = "no_worker"
        elif int(row["resumes"]) >= takeovers:
            reason = "takeovers"
        elif (
            row["status"] == "queued"
            and row["target"] not in serving
            and idle >= min(after, live_within)
        ):
            reason = "no_worker"
        else:
            continue
        run = StuckRun(
            run_id=row["id"],
            name=row["name"],
            version=row["version"],
            tenant_id=row["tenant_id"],
            status=row["status"],
            reason=reason,
            since=since if reason != "takeovers" else 0.0,
            idle_seconds=round(idle, 3),
            resumes=int(row["resumes"]),
            reported=False,
        )
        run.reported = row["stuck_mark"] == run.mark
        stuck.append(run)
    return stuck


def mark_stuck(tx: Tx, run: StuckRun, actor: str) -> bool:
    """Record ``run``'s stuck episode and append its ``run.stuck`` event, once: False when
    another checker reported this episode already (or the run ended meanwhile)."""
    changed = tx.execute(
        "UPDATE runs SET stuck_mark = :mark WHERE id = :id "
        "AND status IN ('queued', 'running', 'waiting') "
        "AND (stuck_mark IS NULL OR stuck_mark <> :mark)",
        {"mark": run.mark, "id": run.run_id},
    )
    if changed:
        insert_event(
            tx,
            run.run_id,
            STUCK_EVENT,
            actor,
            {
                "reason": run.reason,
                "status": run.status,
                "since": run.since,
                "idle_seconds": run.idle_seconds,
                "resumes": run.resumes,
                "agent": run.name,
                "version": run.version,
                "tenant": run.tenant_id,
            },
        )
    return changed > 0
