"""One ``agentledger chaos`` session: proxies, workers, runs, the chaos schedule, then the
evidence the invariants are checked against."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentledger._app import App
from agentledger._chaos.counting import Effect, read_hook_effects
from agentledger._chaos.faults import FaultConfig
from agentledger._chaos.invariants import INVARIANTS, Evidence, Violation, check
from agentledger._chaos.proxy import env_name, proxies
from agentledger._chaos.runner import WorkerPool
from agentledger.errors import StoreError, UsageError
from agentledger.records import Run, RunStatus, Step
from agentledger.store import Store, open_store
from agentledger.testing._chaos import EFFECTS_ENV

SETTLED_WAIT = 30.0
"""A waiting run due back later than this is settled (an approval, a long backoff); one
due sooner is still working and is waited for."""


@dataclass(frozen=True)
class Settings:
    """What one session does (the command's options, checked)."""

    app_path: str
    agent: str
    inputs: list[Any]
    runs: int = 10
    workers: int = 2
    kill_every: float = 0.0
    freeze_every: float = 0.0
    db: str = ""
    proxies: dict[str, str] = field(default_factory=dict)
    faults: FaultConfig | None = None
    seed: int = 7
    timeout: float = 300.0
    lease_seconds: float = 2.0
    concurrency: int = 50
    pg_private: bool = False  # db is then set by run_session
    pg_restart_every: float = 0.0


@contextlib.contextmanager
def private_cluster(settings: Settings) -> Iterator[tuple[Settings, Any]]:
    """``settings`` on a private PostgreSQL cluster when it asks for one (removed on the
    way out), else as they are."""
    if not settings.pg_private:
        yield settings, None
        return
    from agentledger._chaos.pgcluster import ClusterUnavailable, PrivateCluster

    try:
        cluster = PrivateCluster()
    except (ClusterUnavailable, RuntimeError) as exc:
        raise UsageError(f"--pg-private: {exc}") from None
    try:
        cluster.start()
        url = cluster.create_database("chaos")
        yield dataclasses.replace(settings, db=url), cluster
    finally:
        cluster.destroy()


async def run_session(
    settings: Settings, app: App, work_dir: Path, progress: Any = None
) -> dict[str, Any]:
    """Run the session; return the report (``ok`` false when an invariant broke)."""
    with private_cluster(settings) as (settings, cluster):
        return await _session(settings, app, work_dir, progress, cluster)


async def _session(
    settings: Settings, app: App, work_dir: Path, progress: Any, cluster: Any
) -> dict[str, Any]:
    started = time.monotonic()
    rng = random.Random(settings.seed)
    store = open_store(settings.db)
    await store.open()
    effects_file = work_dir / "effects.jsonl"
    try:
        with proxies(settings.proxies, settings.faults) as started_proxies:
            env = {env_name(name): p.url for name, p in started_proxies.items()}
            env[EFFECTS_ENV] = str(effects_file)
            pool = WorkerPool(
                settings.app_path,
                settings.db,
                settings.workers,
                settings.lease_seconds,
                env,
                work_dir,
                settings.concurrency,
            )
            try:
                pool.start()
                await _until_up(pool, started + settings.timeout)
                ids = [
                    await app.submit(
                        store, settings.agent, settings.inputs[i % len(settings.inputs)]
                    )
                    for i in range(settings.runs)
                ]
                timed_out, restarts = await _drive(
                    store, ids, pool, settings, rng, progress, cluster
                )
                ended_at = time.time()
                final = [r for r in await read_runs(store, ids) if r is not None]
            finally:
                pool.stop()
            effects: list[Effect] = [e for p in started_proxies.values() for e in p.effects()]
            proxy_stats = {
                name: {"upstream": p.upstream, "env": env_name(name), **p.stats()}
                for name, p in started_proxies.items()
            }
        effects += read_hook_effects(effects_file)
        journals, found = await judge(store, app, final, effects, ended_at)
    finally:
        await store.close()
    violations = [v.to_dict() for name in INVARIANTS for v in found[name]]
    gave_up = pool.gave_up()
    keys = {(e.provider, e.key) for e in effects if e.key is not None}
    return {
        "ok": not violations and gave_up is None,
        "gave_up": gave_up,
        "app": settings.app_path,
        "agent": settings.agent,
        "db": settings.db,
        "submitted": settings.runs,
        "runs": dict(sorted(Counter(r.status for r in final).items())),
        "timed_out": timed_out,
        "workers": settings.workers,
        "kills": pool.kills,
        "freezes": pool.freezes,
        "pg_restarts": restarts,
        "worker_exits": [
            {"pid": pid, "code": code, "last_line": line} for pid, code, line in pool.exits
        ],
        "steps": sum(len(j) for j in journals.values()),
        "resumes": sum(r.resumes for r in final),
        "effects": {
            "counted": len(effects),
            "keys": len(keys),
            "at_proxies": sum(1 for e in effects if e.source == "proxy"),
            "by_hook": sum(1 for e in effects if e.source == "hook"),
        },
        "proxies": proxy_stats,
        "faults": settings.faults.to_spec() if settings.faults else None,
        "invariants": {name: len(found[name]) for name in INVARIANTS},
        "violations": violations,
        "elapsed_s": round(time.monotonic() - started, 2),
    }


async def judge(
    store: Store, app: App, final: list[Run], effects: list[Effect], ended_at: float
) -> tuple[dict[str, list[Step]], dict[str, list[Violation]]]:
    """The runs' journals, and each invariant's violations over the runs as they were read
    at ``ended_at`` and the side effects counted."""
    journals = {run.id: await store.load_journal(run.id) for run in final}
    events = {run.id: await store.list_events(run.id) for run in final}
    budgets = {}
    for run in final:
        definition = app.get(run.name, run.version)
        if definition is not None:
            budgets[f"{run.name}@{run.version}"] = definition.budget
    return journals, check(Evidence(final, journals, events, effects, budgets, ended_at))


async def read_runs(store: Store, ids: list[str], attempts: int = 50) -> list[Run | None]:
    """The runs, read again while the workers' locks refuse the read."""
    for _ in range(attempts - 1):
        try:
            return [await store.get_run(i) for i in ids]
        except StoreError:
            await asyncio.sleep(0.2)
    return [await store.get_run(i) for i in ids]


def owner_pid(owner: str | None) -> int | None:
    """The pid in a lease owner id (``host:pid:start:nonce...``, read from the right: a
    host name may hold colons), or None."""
    if not owner:
        return None
    parts = owner.rsplit(":", 3)
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


def settled(run: Run | None, now: float) -> bool:
    if run is None or run.status in RunStatus.TERMINAL:
        return True
    return run.status == RunStatus.WAITING and (run.available_at or 0) > now + SETTLED_WAIT


async def _until_up(pool: WorkerPool, deadline: float) -> None:
    """Wait until every worker has started (restarting those that exit), or the pool
    gives up, or the deadline passes: the session's runs, kills and freezes begin with
    the whole pool at work."""
    while not pool.up() and pool.gave_up() is None and time.monotonic() < deadline:
        pool.tick()
        await asyncio.sleep(0.1)


async def _drive(
    store: Store,
    ids: list[str],
    pool: WorkerPool,
    settings: Settings,
    rng: random.Random,
    progress: Any,
    cluster: Any = None,
) -> tuple[bool, int]:
    """Wait for every run to settle while killing and freezing workers and restarting
    the private cluster on schedule; return (whether the timeout came first, restarts)."""
    now = time.monotonic()
    restarts = 0
    every = settings.pg_restart_every if cluster is not None else 0.0
    next_restart = now + every if every > 0 else float("inf")
    deadline = now + settings.timeout
    next_kill = now + settings.kill_every if settings.kill_every > 0 else float("inf")
    next_freeze = now + settings.freeze_every if settings.freeze_every > 0 else float("inf")
    # Past the lease, so another worker takes the runs over before the zombie wakes up.
    freeze_for = settings.lease_seconds * 1.5 + 0.5
    while True:
        try:
            runs = [await store.get_run(i) for i in ids]
        except StoreError:
            # The command only watches: a read the workers' locks refused (a frozen
            # worker may hold SQLite's) is read again.
            if time.monotonic() > deadline:
                return True, restarts
            pool.tick()
            await asyncio.sleep(0.2)
            continue
        done = sum(1 for r in runs if settled(r, time.time()))
        if progress is not None:
            progress(done, len(ids), pool)
        if done == len(ids):
            return False, restarts
        now = time.monotonic()
        if now > deadline or pool.gave_up():
            return now > deadline, restarts
        pool.tick()
        busy = {pid for r in runs if r is not None and (pid := owner_pid(r.lease_owner))}
        if now >= next_kill and pool.kill_one(rng, busy):
            next_kill = now + settings.kill_every
        if now >= next_freeze and pool.freeze_one(rng, freeze_for, busy):
            next_freeze = now + settings.freeze_every
        if now >= next_restart:
            # Off the event loop: the restart takes a while, the progress bar goes on.
            await asyncio.to_thread(cluster.restart)
            restarts += 1
            next_restart = time.monotonic() + every
        await asyncio.sleep(0.1)
