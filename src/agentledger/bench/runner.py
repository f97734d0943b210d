"""The benchmark itself: raw commits and engine runs, interleaved, on one disk.

Figures (see ``docs/benchmarks.md``):

(a) ``raw_commit_us``: one INSERT + COMMIT per step with the same driver, the
    same durability (SQLite: WAL, ``synchronous=FULL``; PostgreSQL: the server's
    commit) and the same disk -- the physical limit of a journaled step.
(b) ``read_step_us`` / ``ctx_step_us``: a 200-step workflow of no-op read-tool
    calls (``ctx.tool``) / no-op ``ctx.step`` calls, executed by an in-process
    Worker; time from just before the first step to just after the last step
    was committed, divided by the step count (measured inside the run, so worker
    start, claim, journal load and the final run update are excluded).
(c) ``write_step_us``: the same with a write tool (``idempotency="provider"``):
    two commits per step (``started``, then the outcome).
(d) ``concurrent_steps_per_s``: N runs x M steps on one worker with
    concurrency N; total steps / (last step end - first step start).
(e) bytes stored per run of 10, 100 and 500 steps of 500-byte messages.

(a), (b), (c) are measured ``reps`` times, interleaved (raw, read, step, write,
raw, read, ...), so that the noise of a shared machine hits them alike; the
figures are medians and the ratios are ratios of medians.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentledger.bench.apps import app as bench_app
from agentledger.bench.resume import resume_latency
from agentledger.records import RunStatus
from agentledger.store import SQLStore, open_store
from agentledger.worker import Worker, WorkerConfig

Progress = Callable[[str], None]


@dataclass
class BenchConfig:
    """Sizes of one benchmark run (``quick`` shrinks them for a smoke test)."""

    db: str | None = None
    quick: bool = False
    reps: int = 5
    steps: int = 200
    concurrent_runs: int = 200
    concurrent_steps: int = 10
    concurrent_reps: int = 3
    sizes: tuple[int, int, int] = (10, 100, 500)
    payload: int = 500
    procs: tuple[int, ...] = (1, 2, 4)
    proc_runs: int = 400
    proc_concurrency: int = 50
    kills: int = 20
    workdir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def make(cls, db: str | None = None, quick: bool = False) -> BenchConfig:
        if not quick:
            return cls(db=db)
        return cls(
            db=db,
            quick=True,
            reps=2,
            steps=30,
            concurrent_runs=20,
            concurrent_steps=5,
            concurrent_reps=1,
            kills=2,
            sizes=(10, 50, 250),
            procs=(1,),
            proc_runs=20,
            proc_concurrency=10,
        )


def is_postgres(url: str | None) -> bool:
    return bool(url) and str(url).startswith(("postgresql://", "postgres://"))


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


# (a) the physical limit --------------------------------------------------------


def raw_sqlite_commit_us(path: str, n: int) -> float:
    """µs per INSERT+COMMIT, WAL, synchronous=FULL, BEGIN IMMEDIATE like the store."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_steps (run_id TEXT NOT NULL, "
            "step_no INTEGER NOT NULL, output TEXT, PRIMARY KEY (run_id, step_no))"
        )
        run_id = uuid.uuid4().hex
        start = time.perf_counter()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO raw_steps VALUES (?, ?, ?)", (run_id, i, str(i)))
            conn.execute("COMMIT")
        return (time.perf_counter() - start) / n * 1e6
    finally:
        conn.close()


_PG_RAW_TABLE = "agentledger_bench_raw"


def raw_postgres_commit_us(url: str, n: int) -> float:
    """µs per INSERT+COMMIT with psycopg on the server (a logged table)."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_PG_RAW_TABLE} (run_id TEXT NOT NULL, "
            "step_no INTEGER NOT NULL, output TEXT, PRIMARY KEY (run_id, step_no))"
        )
        conn.commit()
        run_id = uuid.uuid4().hex
        start = time.perf_counter()
        for i in range(n):
            conn.execute(f"INSERT INTO {_PG_RAW_TABLE} VALUES (%s, %s, %s)", (run_id, i, str(i)))
            conn.commit()
        return (time.perf_counter() - start) / n * 1e6


def drop_postgres_raw(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {_PG_RAW_TABLE}")


def postgres_settings(url: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        out = {}
        for name in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "commit_delay",
        ):
            row = conn.execute(f"SHOW {name}").fetchone()
            out[name] = str(row[0]) if row else "?"
        return out


# (b)-(d) engine runs ----------------------------------------------------------------


async def execute(
    store: SQLStore,
    name: str,
    inputs: list[dict[str, Any]],
    concurrency: int,
    timeout: float = 600.0,
) -> tuple[list[dict[str, Any]], float]:
    """Submit runs, drain them with a fresh in-process Worker, return their results.

    Also returns the wall time from worker start to the last run finished (which
    includes worker startup and claiming; the per-step figures do not).
    """
    ids = [await bench_app.submit(store, name, inp) for inp in inputs]
    pending = set(ids)
    done = asyncio.Event()

    def finished(run_id: str, outcome: str) -> None:
        pending.discard(run_id)
        if not pending:
            done.set()

    worker = Worker(
        store,
        bench_app,
        WorkerConfig(
            concurrency=concurrency,
            lease_seconds=120.0,
            poll_seconds=0.01,
            reap_seconds=3600.0,
            outbox=False,
        ),
    )
    worker.on_finished = finished
    start = time.perf_counter()
    task = asyncio.create_task(worker.run(install_signals=False))
    waiter = asyncio.create_task(done.wait())
    try:
        finished_first, _ = await asyncio.wait(
            [task, waiter], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        wall = time.perf_counter() - start
        if waiter not in finished_first:
            raise RuntimeError(
                f"benchmark runs of {name} did not finish ({len(pending)} of {len(ids)} left)"
            )
    finally:
        worker.stop()
        waiter.cancel()
        await asyncio.gather(task, waiter, return_exceptions=True)
    results = []
    for run_id in ids:
        run = await store.get_run(run_id)
        if run is None or run.status != RunStatus.COMPLETED:
            status = run.status if run else "missing"
            error = run.error if run else ""
            raise RuntimeError(f"benchmark run {run_id} ({name}) ended {status}: {error}")
        results.append(run.result)
    return results, wall


async def per_step_us(store: SQLStore, name: str, steps: int) -> float:
    (result,), _ = await execute(store, name, [{"steps": steps}], concurrency=1)
    return float(result["elapsed_s"]) / steps * 1e6


async def concurrent(store: SQLStore, runs: int, steps: int) -> tuple[float, float, list[int]]:
    """(steps/s inside the runs, steps/s from worker start, group sizes seen)."""
    before = len(store.group_sizes)
    results, wall = await execute(
        store, "bench_read_tool", [{"steps": steps} for _ in range(runs)], concurrency=runs
    )
    groups = store.group_sizes[before:]
    span = max(r["t_last"] for r in results) - min(r["t_first"] for r in results)
    total = runs * steps
    return total / span, total / wall, groups


# (e) bytes -------------------------------------------------------------------------


def _sqlite_size(path: str) -> tuple[int, int]:
    """(page_count * page_size, used bytes by dbstat or -1) after a WAL checkpoint."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        try:
            used = conn.execute("SELECT SUM(pgsize - unused) FROM dbstat").fetchone()[0]
        except sqlite3.Error:
            used = -1
        return int(pages * page_size), int(used or 0)
    finally:
        conn.close()


async def sqlite_bytes(workdir: Path, n: int, payload: int) -> dict[str, int]:
    """Growth of a fresh database file from an empty run to an ``n``-step run."""
    path = workdir / f"bytes-{n}.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        await execute(store, "bench_payload", [{"steps": 0, "size": payload}], concurrency=1)
        base_file, base_used = _sqlite_size(str(path))
        await execute(store, "bench_payload", [{"steps": n, "size": payload}], concurrency=1)
        file, used = _sqlite_size(str(path))
    finally:
        await store.close()
    return {
        "steps": n,
        "file_growth": file - base_file,
        "dbstat_used_growth": used - base_used if used >= 0 else -1,
    }


def _pg_run_bytes(url: str, run_id: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        total = 0
        for table in ("runs", "steps", "events"):
            column = "id" if table == "runs" else "run_id"
            row = conn.execute(
                f"SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM {table} t WHERE {column} = %s",
                (run_id,),
            ).fetchone()
            total += int(row[0]) if row else 0
        return total


async def postgres_bytes(store: SQLStore, url: str, n: int, payload: int) -> dict[str, int]:
    """Row bytes (``pg_column_size``) of an ``n``-step run minus those of an empty run."""
    ids = []
    for steps in (0, n):
        before = {r.id for r in await store.list_runs(name="bench_payload", limit=10**6)}
        await execute(store, "bench_payload", [{"steps": steps, "size": payload}], concurrency=1)
        after = {r.id for r in await store.list_runs(name="bench_payload", limit=10**6)}
        ids.append((after - before).pop())
    base = await asyncio.to_thread(_pg_run_bytes, url, ids[0])
    size = await asyncio.to_thread(_pg_run_bytes, url, ids[1])
    return {"steps": n, "row_growth": size - base}


# PostgreSQL: several worker processes ----------------------------------------------


def _pg_poll_done(url: str, ids: list[str]) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM runs WHERE id = ANY(%s) AND status NOT IN "
            "('queued', 'running', 'waiting')",
            (ids,),
        ).fetchone()
        return int(row[0]) if row else 0


def _pg_results(url: str, ids: list[str]) -> list[tuple[str, Any]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT status, result FROM runs WHERE id = ANY(%s)", (ids,)).fetchall()
    return [(str(s), json.loads(r) if isinstance(r, str) else r) for s, r in rows]


async def process_throughput(
    store: SQLStore,
    url: str,
    procs: int,
    runs: int,
    steps: int,
    concurrency: int,
    workdir: Path,
    timeout: float = 600.0,
) -> float:
    """Steps/s of ``procs`` worker subprocesses draining ``runs`` pre-submitted runs.

    The runs wait at a gate (a file) until every worker process is up, so that
    process startup is not measured; steps/s = all steps / (last step end - first
    step start), on the wall clock shared by the processes.
    """
    gate = workdir / f"gate-{procs}-{uuid.uuid4().hex[:6]}"
    ids = [
        await bench_app.submit(store, "bench_read_tool", {"steps": steps, "gate": str(gate)})
        for _ in range(runs)
    ]
    command = [
        sys.executable,
        "-m",
        "agentledger.cli.main",
        "worker",
        "--app",
        "agentledger.bench.apps:app",
        "--db",
        url,
        "--concurrency",
        str(concurrency),
        "--poll-seconds",
        "0.05",
        "--no-outbox",
    ]
    children = [
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        for _ in range(procs)
    ]
    try:
        pids = {c.pid for c in children}
        deadline = time.monotonic() + 60
        while True:
            live = {w.pid for w in await store.list_workers(live_within=60)}
            if pids <= live:
                break
            if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                raise RuntimeError("benchmark worker processes did not start")
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # let every process make its first claim
        gate.touch()
        deadline = time.monotonic() + timeout
        while await asyncio.to_thread(_pg_poll_done, url, ids) < len(ids):
            if time.monotonic() > deadline:
                raise RuntimeError("benchmark runs on worker processes did not finish")
            await asyncio.sleep(0.1)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        gate.unlink(missing_ok=True)
    results = await asyncio.to_thread(_pg_results, url, ids)
    bad = [s for s, _ in results if s != RunStatus.COMPLETED]
    if bad:
        raise RuntimeError(f"{len(bad)} benchmark runs on worker processes ended {bad[0]}")
    span = max(r["t_last"] for _, r in results) - min(r["t_first"] for _, r in results)
    return runs * steps / span


# the whole benchmark -----------------------------------------------------------------


def _group_stats(groups: list[int]) -> dict[str, float]:
    if not groups:
        return {"count": 0, "median": 0.0, "mean": 0.0, "max": 0}
    return {
        "count": len(groups),
        "median": _median([float(g) for g in groups]),
        "mean": round(statistics.fmean(groups), 2),
        "max": max(groups),
    }


async def run_bench(config: BenchConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run every figure; return the JSON-able report."""
    say = progress or (lambda _msg: None)
    postgres = is_postgres(config.db)
    if config.workdir:
        base_dir = Path(config.workdir)
    elif config.db and not postgres:
        from agentledger.store.sqlite import sqlite_path

        base_dir = Path(sqlite_path(config.db)[0]).resolve().parent
    else:
        base_dir = Path.cwd()  # the default database lives in the current directory
    workdir = Path(tempfile.mkdtemp(prefix=".agentledger-bench-", dir=base_dir))
    try:
        return await _run(config, workdir, postgres, say)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _run(config: BenchConfig, workdir: Path, postgres: bool, say: Progress) -> dict[str, Any]:
    url = config.db if config.db else f"sqlite:///{workdir / 'engine.db'}"
    raw_db = str(workdir / "raw.db")

    def raw(n: int) -> float:
        if postgres:
            assert config.db is not None
            return raw_postgres_commit_us(config.db, n)
        return raw_sqlite_commit_us(raw_db, n)

    store = open_store(url)
    await store.open()
    report: dict[str, Any] = {
        "backend": "postgresql" if postgres else "sqlite",
        "quick": config.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version,
            "platform": sys.platform,
        },
        "sizes": {
            "reps": config.reps,
            "steps": config.steps,
            "concurrent_runs": config.concurrent_runs,
            "concurrent_steps": config.concurrent_steps,
        },
        "per_step_timing": "inside the run: first step start to last step committed, / steps",
    }
    try:
        if postgres:
            assert config.db is not None
            report["postgres"] = await asyncio.to_thread(postgres_settings, config.db)
        # warm up: imports, schema, page cache, the first claim
        raw(20)
        await per_step_us(store, "bench_read_tool", 5)
        samples: dict[str, list[float]] = {"raw": [], "read": [], "step": [], "write": []}
        for rep in range(config.reps):
            say(f"(a)-(c) repetition {rep + 1}/{config.reps}")
            samples["raw"].append(raw(config.steps))
            samples["read"].append(await per_step_us(store, "bench_read_tool", config.steps))
            samples["step"].append(await per_step_us(store, "bench_step", config.steps))
            samples["write"].append(await per_step_us(store, "bench_write_tool", config.steps))
        raw_us = _median(samples["raw"])
        for key, name in (("read", "read_step"), ("step", "ctx_step"), ("write", "write_step")):
            value = _median(samples[key])
            report[f"{name}_us"] = round(value, 1)
            report[f"{name}_ratio"] = round(value / raw_us, 3)
            paired = [v / r for v, r in zip(samples[key], samples["raw"], strict=True)]
            report[f"{name}_ratio_paired_median"] = round(_median(paired), 3)
        report["raw_commit_us"] = round(raw_us, 1)
        report["samples_us"] = {k: [round(v, 1) for v in vs] for k, vs in samples.items()}

        rates, e2e, groups, raw_d = [], [], [], []
        for rep in range(config.concurrent_reps):
            say(
                f"(d) {config.concurrent_runs} concurrent runs, repetition "
                f"{rep + 1}/{config.concurrent_reps}"
            )
            raw_d.append(raw(config.steps))
            rate, end_to_end, seen = await concurrent(
                store, config.concurrent_runs, config.concurrent_steps
            )
            rates.append(rate)
            e2e.append(end_to_end)
            groups.extend(seen)
        report["concurrent_steps_per_s"] = round(_median(rates), 1)
        report["concurrent_steps_per_s_from_worker_start"] = round(_median(e2e), 1)
        report["concurrent_samples_steps_per_s"] = [round(r, 1) for r in rates]
        report["raw_commits_per_s"] = round(1e6 / _median(raw_d), 1)
        report["concurrent_over_raw_commits"] = round(
            report["concurrent_steps_per_s"] / report["raw_commits_per_s"], 3
        )
        report["group_sizes"] = _group_stats(groups)

        say("(e) bytes stored")
        _small, mid, large = config.sizes
        grown: dict[int, int] = {}
        file_grown: dict[int, int] = {}
        details = []
        for n in config.sizes:
            if postgres:
                assert config.db is not None
                found = await postgres_bytes(store, config.db, n, config.payload)
                grown[n] = found["row_growth"]
            else:
                found = await sqlite_bytes(workdir, n, config.payload)
                used = found["dbstat_used_growth"]
                grown[n] = used if used >= 0 else found["file_growth"]
                file_grown[n] = found["file_growth"]
            details.append(found)
        if postgres:
            report["bytes_method"] = (
                "sum of pg_column_size of the run's rows (runs, steps, events) minus an empty run's"
            )
        elif all(d["dbstat_used_growth"] >= 0 for d in details):
            report["bytes_method"] = (
                "dbstat: growth of SUM(pgsize - unused) over every b-tree page (rows, indexes, "
                "page headers; not the free space inside pages) after a WAL checkpoint, from an "
                "empty run to the n-step run, a fresh file per size"
            )
        else:
            report["bytes_method"] = (
                "file growth: page_count * page_size after a WAL "
                "checkpoint, from an empty run to the n-step run"
            )
        if file_grown:
            report["file_growth_500_over_100"] = round(
                file_grown[large] / max(file_grown[mid], 1), 3
            )
            report["file_bytes_over_payload"] = round(
                file_grown[large] / (large * config.payload), 3
            )
        report["bytes"] = details
        report["bytes_sizes"] = list(config.sizes)
        report["bytes_growth_500_over_100"] = round(grown[large] / max(grown[mid], 1), 3)
        report["stored_bytes_over_payload"] = round(grown[large] / (large * config.payload), 3)
        report["bytes_per_step_500"] = round(grown[large] / large, 1)

        if postgres:
            assert config.db is not None
            throughput = {}
            for procs in config.procs:
                say(f"throughput with {procs} worker process(es)")
                throughput[str(procs)] = round(
                    await process_throughput(
                        store,
                        config.db,
                        procs,
                        config.proc_runs,
                        config.concurrent_steps,
                        config.proc_concurrency,
                        workdir,
                    ),
                    1,
                )
            report["process_throughput_steps_per_s"] = throughput
            await asyncio.to_thread(drop_postgres_raw, config.db)
        if config.kills:
            say(f"kill -> resume, {config.kills} kills per case")
            report["resume"] = await resume_latency(store, url, workdir, config.kills)
    finally:
        await store.close()
    report["targets"] = {
        "read_step_ratio": 1.5,
        "write_step_ratio": 2.5,
        "concurrent_steps_per_s": 5000,
        "bytes_growth_500_over_100": 5.5,
        "stored_bytes_over_payload": 2.0,
    }
    return report
