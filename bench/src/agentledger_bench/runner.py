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
(c) ``write_step_us``: the same with a write tool (``idempotency="provider"``): one
    commit per step, its ``started`` carrying the previous write's held outcome.
(d) ``concurrent_steps_per_s``: N runs x M steps on one worker with
    concurrency N; total steps / (last step end - first step start).
(e) bytes stored per run of 10, 100 and 500 steps of 500-byte messages.

(a), (b), (c) are measured ``reps`` times, interleaved (raw, read, step, write,
raw, read, ...), so that the noise of a shared machine hits them alike; the
figures are medians and the ratios are ratios of medians.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentledger.store import open_store
from agentledger_bench.baseline import (
    drop_postgres_raw,
    postgres_settings,
    raw_postgres_commit_us,
    raw_sqlite_commit_us,
)
from agentledger_bench.engine_runs import concurrent, per_step_us
from agentledger_bench.processes import process_throughput
from agentledger_bench.resume import resume_latency
from agentledger_bench.storage import postgres_bytes, sqlite_bytes

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
            # One round per case: enough to exercise kill -> resume end to end.
            kills=1,
            sizes=(10, 50, 250),
            procs=(1,),
            proc_runs=20,
            proc_concurrency=10,
        )


def is_postgres(url: str | None) -> bool:
    return bool(url) and str(url).startswith(("postgresql://", "postgres://"))


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


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
        from agentledger.store._sqlite import sqlite_path

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
            throughput, costs = {}, {}
            for procs in config.procs:
                say(f"throughput with {procs} worker process(es)")
                cost: dict[str, Any] = {}
                throughput[str(procs)] = round(
                    await process_throughput(
                        store,
                        config.db,
                        procs,
                        config.proc_runs,
                        config.concurrent_steps,
                        config.proc_concurrency,
                        workdir,
                        costs=cost,
                    ),
                    1,
                )
                costs[str(procs)] = cost
            report["process_throughput_steps_per_s"] = throughput
            report["process_costs"] = costs
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
