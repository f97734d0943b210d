"""One ``agentledger soak``: a steady mixed load on worker processes under kills (and
PostgreSQL restarts) for hours, sampled over time, then the chaos invariants over every
run and a verdict on memory.

Built on the chaos session's parts (the worker pool, the proxies, the private cluster,
the invariants): the soak adds the load at a target rate, the approvals it decides
itself, the sampling and the leak rule.

The leak rule: the least-squares slope of the workers' total RSS over the second half of
the load, in MB per hour, must not exceed ``leak_mb_per_hour``. It is judged only when
that half lasts :data:`LEAK_MIN_SECONDS` or more: over a shorter one, the workers'
warm-up reads as growth.
"""

from __future__ import annotations

import asyncio
import csv
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentledger._app import App
from agentledger._chaos.counting import Effect, read_hook_effects
from agentledger._chaos.invariants import INVARIANTS
from agentledger._chaos.proxy import env_name, proxies
from agentledger._chaos.runner import WorkerPool
from agentledger._chaos.sampling import (
    COLUMNS,
    DbSample,
    percentile,
    rss_mb,
    sample_db,
    slope_per_hour,
    worker_rss,
)
from agentledger._chaos.session import (
    Settings,
    judge,
    owner_pid,
    private_cluster,
    read_runs,
    settled,
)
from agentledger._chaos.soakplot import write_svg
from agentledger._clock import SYSTEM
from agentledger.errors import AgentLedgerError, StoreError
from agentledger.records import ApprovalDecision, RunStatus
from agentledger.store import Store, Tx, open_store
from agentledger.testing._chaos import EFFECTS_ENV

LEAK_MIN_SECONDS = 600.0
"""The shortest second half of a soak the leak rule judges."""

DECIDER = "soak"
"""Who the soak records as the decider of the approvals it decides."""


@dataclass(frozen=True)
class SoakSettings:
    """What one soak does (the command's options, checked)."""

    chaos: Settings  # the workers, kills, database, proxies and faults; timeout: the drain's
    loads: list[tuple[str, list[Any]]]  # (agent, its inputs), submitted in turn
    seconds: float
    out: Path
    rate: float = 5.0
    sample_every: float = 10.0
    approve_after: float = 2.0
    reject_share: float = 0.2
    leak_mb_per_hour: float = 20.0


@dataclass
class _State:
    """What the soak counts while it runs."""

    started: float  # monotonic
    started_wall: float
    submitted: int = 0
    submit_errors: int = 0
    submit_ms: list[float] = field(default_factory=list)  # since the last sample
    kills_at: list[float] = field(default_factory=list)  # seconds from the start
    restarts_at: list[float] = field(default_factory=list)
    decided: Counter[str] = field(default_factory=Counter)
    rows: list[dict[str, Any]] = field(default_factory=list)
    last_terminal: int = 0
    last_sample_wall: float = 0.0
    last_sample: float = 0.0  # monotonic

    def t(self) -> float:
        return time.monotonic() - self.started


def _runs_since(tx: Tx, at: float) -> list[str]:
    rows = tx.fetchall(
        "SELECT id FROM runs WHERE created_at >= :at ORDER BY created_at", {"at": at}
    )
    return [r["id"] for r in rows]


def _unsettled(tx: Tx, at: float) -> int:
    """Runs submitted since ``at`` still working (the chaos session's ``settled``, in SQL)
    or waiting for an approval the soak has yet to decide."""
    found = tx.fetchall(
        "SELECT COUNT(*) AS n FROM runs WHERE created_at >= :at AND (status IN "
        "('queued', 'running') OR (status = 'waiting' AND (COALESCE(available_at, 0) <= :soon "
        "OR EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = runs.id "
        "AND a.decision IS NULL))))",
        {"at": at, "soon": time.time() + 30.0},
    )
    return int(found[0]["n"])


async def run_soak(
    settings: SoakSettings, app: App, work_dir: Path, progress: Callable[..., None] | None = None
) -> dict[str, Any]:
    """Run the soak; return its summary (``ok`` false on a broken invariant or a leak)."""
    with private_cluster(settings.chaos) as (chaos, cluster):
        return await _soak(settings, chaos, app, work_dir, progress, cluster)


async def _soak(
    settings: SoakSettings,
    chaos: Settings,
    app: App,
    work_dir: Path,
    progress: Callable[..., None] | None,
    cluster: Any,
) -> dict[str, Any]:
    rng = random.Random(chaos.seed)
    settings.out.mkdir(parents=True, exist_ok=True)
    csv_path, svg_path = settings.out / "soak.csv", settings.out / "soak.svg"
    state = _State(time.monotonic(), time.time())
    state.last_sample, state.last_sample_wall = state.started, state.started_wall
    # Runs created from here on are the soak's (a --db may hold others).
    since = state.started_wall - 1.0
    store = open_store(chaos.db)
    await store.open()
    effects_file = work_dir / "effects.jsonl"
    try:
        with proxies(chaos.proxies, chaos.faults) as started_proxies, csv_path.open("w") as out:
            writer = csv.DictWriter(out, fieldnames=COLUMNS)
            writer.writeheader()
            env = {env_name(name): p.url for name, p in started_proxies.items()}
            env[EFFECTS_ENV] = str(effects_file)
            pool = WorkerPool(
                chaos.app_path,
                chaos.db,
                chaos.workers,
                chaos.lease_seconds,
                env,
                work_dir,
                chaos.concurrency,
            )
            try:
                pool.start()
                timed_out = await _drive(
                    store, app, pool, settings, chaos, cluster, rng, state, writer, out, progress
                )
                ended_at = time.time()
                ids = await store.read(_runs_since, since)
                final = [r for r in await read_runs(store, ids) if r is not None]
            finally:
                pool.stop()
            effects: list[Effect] = [e for p in started_proxies.values() for e in p.effects()]
        effects += read_hook_effects(effects_file)
        journals, found = await judge(store, app, final, effects, ended_at)
    finally:
        await store.close()
    write_svg(state.rows, state.kills_at, state.restarts_at, settings.seconds, svg_path)
    violations = [v.to_dict() for name in INVARIANTS for v in found[name]]
    leak = leak_verdict(state.rows, settings.seconds, settings.leak_mb_per_hour)
    gave_up = pool.gave_up()
    unsettled = [r.id for r in final if not settled(r, ended_at)]
    return {
        "ok": not violations and not leak["leaked"] and gave_up is None,
        "gave_up": gave_up,
        "app": chaos.app_path,
        "agents": [agent for agent, _ in settings.loads],
        "db": chaos.db,
        "seconds": settings.seconds,
        "rate": settings.rate,
        "submitted": state.submitted,
        "submit_errors": state.submit_errors,
        "runs": dict(sorted(Counter(r.status for r in final).items())),
        "unsettled_at_end": len(unsettled),
        "timed_out": timed_out,
        "workers": chaos.workers,
        "kills": pool.kills,
        "pg_restarts": len(state.restarts_at),
        "approvals": dict(state.decided),
        "steps": sum(len(j) for j in journals.values()),
        "resumes": sum(r.resumes for r in final),
        "effects": len(effects),
        "faults": chaos.faults.to_spec() if chaos.faults else None,
        "samples": len(state.rows),
        "memory": memory_figures(state.rows),
        "latency_quarters": latency_quarters(state.rows, settings.seconds),
        "leak": leak,
        "invariants": {name: len(found[name]) for name in INVARIANTS},
        "violations": violations,
        "csv": str(csv_path),
        "svg": str(svg_path),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(state.started_wall)),
        "elapsed_s": round(state.t(), 1),
    }


async def _drive(
    store: Store,
    app: App,
    pool: WorkerPool,
    settings: SoakSettings,
    chaos: Settings,
    cluster: Any,
    rng: random.Random,
    state: _State,
    writer: csv.DictWriter[str],
    out: Any,
    progress: Callable[..., None] | None,
) -> bool:
    """Submit at the rate for the soak's length while killing workers, restarting the
    private cluster, deciding approvals and sampling; then drain (no more kills) until
    every run settles. Return whether the drain timed out."""
    next_kill = chaos.kill_every if chaos.kill_every > 0 else float("inf")
    every = chaos.pg_restart_every if cluster is not None else 0.0
    next_restart = every if every > 0 else float("inf")
    next_decide = 0.0
    since = state.started_wall - 1.0
    drain_until: float | None = None
    while True:
        t = state.t()
        loading = t < settings.seconds
        if loading:
            await _submit_due(store, app, settings, state, t)
        elif drain_until is None:
            drain_until = t + chaos.timeout
        pool.tick()
        if pool.gave_up():
            return False
        try:
            if loading and t >= next_kill:
                busy = {pid for o in await store.lease_owners() if (pid := owner_pid(o))}
                if pool.kill_one(rng, busy):
                    state.kills_at.append(t)
                    next_kill = t + chaos.kill_every
            if t >= next_decide:
                await _decide(store, settings, rng, state)
                next_decide = t + 1.0
            if time.monotonic() - state.last_sample >= settings.sample_every:
                row = await _sample(store, pool, chaos, state)
                writer.writerow(row)
                out.flush()
                if progress is not None:
                    progress(state, pool, row)
            if drain_until is not None and (
                t > drain_until or await store.read(_unsettled, since) == 0
            ):
                # The last interval is sampled, so the figures reach the end.
                writer.writerow(await _sample(store, pool, chaos, state))
                out.flush()
                return t > drain_until
        except StoreError:
            # The cluster is restarting, or a worker holds SQLite's lock: next time.
            pass
        if loading and t >= next_restart:
            # Off the event loop: the restart takes a while, the workers go on failing.
            await asyncio.to_thread(cluster.restart)
            state.restarts_at.append(t)
            next_restart = state.t() + every
        await asyncio.sleep(0.05)


async def _submit_due(
    store: Store, app: App, settings: SoakSettings, state: _State, t: float
) -> None:
    due = int(t * settings.rate) + 1 - state.submitted
    for _ in range(max(0, min(due, 50))):
        agent, inputs = settings.loads[state.submitted % len(settings.loads)]
        value = inputs[(state.submitted // len(settings.loads)) % len(inputs)]
        began = time.monotonic()
        try:
            await app.submit(store, agent, value)
        except StoreError:
            # Not lost if it was written: the invariants read every run the database
            # holds since the start, not the ids the submits returned.
            state.submit_errors += 1
            return
        state.submit_ms.append((time.monotonic() - began) * 1000)
        state.submitted += 1


async def _decide(store: Store, settings: SoakSettings, rng: random.Random, state: _State) -> None:
    """Decide every approval pending longer than ``approve_after``: a share rejected."""
    now = time.time()
    for approval in await store.get_approvals(pending=True):
        if approval.requested_at > now - settings.approve_after:
            continue
        reject = rng.random() < settings.reject_share
        decision = ApprovalDecision.REJECT if reject else ApprovalDecision.APPROVE
        try:
            await store.decide_approval(approval.id, decision, DECIDER, SYSTEM)
        except AgentLedgerError:
            continue  # decided meanwhile (its expiry's default), or the run was cancelled
        state.decided[str(decision)] += 1


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


async def _sample(store: Store, pool: WorkerPool, chaos: Settings, state: _State) -> dict[str, Any]:
    now_wall, now = time.time(), time.monotonic()
    db: DbSample = await store.read(
        sample_db, state.last_sample_wall, chaos.lease_seconds, state.started_wall - 1.0
    )
    rss = worker_rss(p.pid for p in pool.procs if p.poll() is None)
    terminal = db.terminal()
    interval = max(now - state.last_sample, 1e-6)
    row = {
        "t_s": round(now - state.started, 1),
        "utc": time.strftime("%H:%M:%S", time.gmtime(now_wall)),
        "workers": len(rss),
        "rss_total_mb": _fmt(sum(rss.values())),
        "rss_max_mb": _fmt(max(rss.values(), default=None)),
        "rss_workers_mb": " ".join(f"{pid}:{mb:.1f}" for pid, mb in sorted(rss.items())),
        "rss_soak_mb": _fmt(rss_mb(os.getpid())),
        "submitted": state.submitted,
        "completed_per_s": _fmt((terminal - state.last_terminal) / interval, 2),
        "steps": len(db.step_ms),
        "step_p50_ms": _fmt(percentile(db.step_ms, 50)),
        "step_p95_ms": _fmt(percentile(db.step_ms, 95)),
        "step_p99_ms": _fmt(percentile(db.step_ms, 99)),
        "submit_p50_ms": _fmt(percentile(state.submit_ms, 50)),
        "queue_delay_p50_s": _fmt(percentile(db.queue_delays, 50), 3),
        "queue_delay_p95_s": _fmt(percentile(db.queue_delays, 95), 3),
        "queue_depth": db.by_status.get(RunStatus.QUEUED, 0),
        "waiting": db.by_status.get(RunStatus.WAITING, 0),
        "stuck": db.stuck,
        "db_bytes": db.db_bytes,
        "outbox_dead": db.outbox_dead,
        "kills": pool.kills,
        "pg_restarts": len(state.restarts_at),
        "approvals_decided": sum(state.decided.values()),
    }
    state.rows.append(row)
    state.last_terminal, state.submit_ms = terminal, []
    state.last_sample, state.last_sample_wall = now, now_wall
    return row


def _series(rows: list[dict[str, Any]], column: str) -> list[tuple[float, float]]:
    return [(float(r["t_s"]), float(r[column])) for r in rows if r[column] not in ("", None)]


def leak_verdict(rows: list[dict[str, Any]], seconds: float, limit: float) -> dict[str, Any]:
    """The leak rule (module doc) over the samples ``rows`` of a soak ``seconds`` long."""
    half = [p for p in _series(rows, "rss_total_mb") if seconds / 2 <= p[0] <= seconds]
    judged = seconds / 2 >= LEAK_MIN_SECONDS and len(half) >= 2
    slope = slope_per_hour(half)
    return {
        "rule": f"slope of the workers' total RSS over the second half <= {limit:g} MB/h "
        f"(judged when that half lasts {LEAK_MIN_SECONDS:g} s or more)",
        "slope_mb_per_hour": round(slope, 2),
        "limit_mb_per_hour": limit,
        "judged": judged,
        "leaked": judged and slope > limit,
    }


def memory_figures(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The workers' total RSS at the first and last samples, and its peak (MB)."""
    total = _series(rows, "rss_total_mb")
    return {
        "start_total_mb": total[0][1] if total else None,
        "end_total_mb": total[-1][1] if total else None,
        "peak_total_mb": max((v for _, v in total), default=None),
        "peak_worker_mb": max((v for _, v in _series(rows, "rss_max_mb")), default=None),
    }


def latency_quarters(rows: list[dict[str, Any]], seconds: float) -> list[dict[str, Any]]:
    """Per quarter of the load: the medians of the samples' step p50, p95 and p99 (ms)."""
    quarters = []
    for q in range(4):
        lo, hi = seconds * q / 4, seconds * (q + 1) / 4
        inside = [r for r in rows if lo < float(r["t_s"]) <= hi]
        figures: dict[str, Any] = {"quarter": q + 1, "samples": len(inside)}
        for column in ("step_p50_ms", "step_p95_ms", "step_p99_ms", "queue_delay_p50_s"):
            values = [float(r[column]) for r in inside if r[column] not in ("", None)]
            figures[column] = round(statistics.median(values), 3) if values else None
        quarters.append(figures)
    return quarters
