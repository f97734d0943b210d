"""A worker's step latency while a large history is pruned: ``python -m
agentledger_bench.prune_latency [--db URL] [--steps 100000] [--json]``.

Seeds the store (a new SQLite file, or the EMPTY database ``--db`` names) with a history
of ``--steps`` steps in tenant ``hist`` (runs of 100 no-op ``ctx.step`` calls, executed
by a real worker and sealed into the audit chain), then times every step of a probe
worker (an in-process ``Worker``, concurrency 8, waves of 8 runs of 50 steps in tenant
``probe``, each step timed inside the run) in three phases of one process:

- ``before``: no prune;
- ``pruning``: ``agentledger prune --older-than 0s --tenant hist`` of the whole history
  running in another process (``--prune-child``: the same ``prune_tenant`` the CLI
  calls); only the steps that ended between its first batch and its exit count;
- ``after``: no prune again (the history gone), a second baseline against drift.

With ``--in-worker`` the prune runs in the probe worker's own process and store instead
(what ``worker --prune-every`` does: its batches share the worker's connections).

Figures per phase: steps, p50, p99 and max in milliseconds; and the prune's records,
runs and seconds. Nothing here is asserted: it is a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agentledger.cli._features  # noqa: F401 (the audit chain a prune checks and extends)
from agentledger import _sealer as sealer
from agentledger._prune import prune_tenant
from agentledger.cli._ops import worker_companions
from agentledger.records import RunStatus
from agentledger.store import Store, open_store
from agentledger.store._queries.retention import Policy
from agentledger.worker import Worker, WorkerConfig
from agentledger_bench.apps import app as bench_app
from agentledger_bench.stats import percentile

HISTORY = "hist"
PROBE = "probe"
RUN_STEPS = 100  # steps per history run
WAVE, WAVE_STEPS = 8, 50  # probe runs per wave, steps per probe run


async def _wait_done(store: Store, ids: list[str]) -> list[dict[str, Any]]:
    results = []
    for run_id in ids:
        while True:
            run = await store.get_run(run_id)
            if run is not None and run.status in RunStatus.TERMINAL:
                break
            await asyncio.sleep(0.02)
        if run.status != RunStatus.COMPLETED:
            raise RuntimeError(f"probe run {run_id} ended {run.status}")
        results.append(run.result or {})
    return results


async def _seed(store: Store, steps: int, say: Any) -> float:
    t0 = time.perf_counter()
    runs = max(1, steps // RUN_STEPS)
    for i in range(runs):
        await bench_app.submit(store, "bench_step", {"steps": RUN_STEPS}, tenant_id=HISTORY)
        if (i + 1) % 200 == 0:
            say(f"submitted {i + 1}/{runs} history runs")
    config = WorkerConfig(poll_seconds=0.02, concurrency=50)
    companions = worker_companions(config)
    await Worker(store, bench_app, config, burst=True, companions=companions).run(
        install_signals=False
    )
    while await sealer.seal_once(store):
        pass
    return time.perf_counter() - t0


async def _wave(store: Store) -> list[list[float]]:
    ids = [
        await bench_app.submit(store, "bench_step_times", {"steps": WAVE_STEPS}, tenant_id=PROBE)
        for _ in range(WAVE)
    ]
    return [t for r in await _wait_done(store, ids) for t in r["times"]]


def _figures(times: list[list[float]]) -> dict[str, Any]:
    ms = sorted(d * 1000 for _, d in times)
    if not ms:
        return {"steps": 0}
    p99 = percentile(ms, 0.99)
    return {
        "steps": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(p99, 3),
        "max_ms": round(ms[-1], 3),
    }


async def run(
    url: str, steps: int, waves: int, say: Any, in_worker: bool = False
) -> dict[str, Any]:
    """Seed, then the three phases; returns the report."""
    store = open_store(url)
    await store.open()
    try:
        seed_s = await _seed(store, steps, say)
        say(f"history seeded and sealed in {seed_s:.0f} s")
        config = WorkerConfig(poll_seconds=0.01, concurrency=WAVE)
        worker = Worker(store, bench_app, config, companions=worker_companions(config))
        running = asyncio.create_task(worker.run(install_signals=False))
        try:
            before: list[list[float]] = []
            for _ in range(waves):
                before += await _wave(store)
            say("before: done; pruning")
            during: list[list[float]] = []
            if in_worker:
                started = time.time()
                pruning = asyncio.create_task(prune_tenant(store, Policy(HISTORY, 0.0)))
                while not pruning.done():
                    during += await _wave(store)
                ended = time.time()
                got = pruning.result()
                pruned = {"records": got.records, "runs": got.runs, "stopped": got.stopped}
            else:
                child = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "agentledger_bench.prune_latency", "--prune-child",
                    "--db", url, stdout=subprocess.PIPE, env=dict(os.environ),
                )  # fmt: skip
                assert child.stdout is not None
                await child.stdout.readline()  # "started": its store is open
                started = time.time()
                waiting = asyncio.create_task(child.wait())
                while not waiting.done():
                    during += await _wave(store)
                ended = time.time()
                pruned = json.loads((await child.stdout.read()).decode() or "{}")
            during = [t for t in during if started <= t[0] <= ended]
            say("pruning: done")
            after: list[list[float]] = []
            for _ in range(waves):
                after += await _wave(store)
        finally:
            worker.stop()
            await running
    finally:
        await store.close()
    return {
        "backend": url.split(":", 1)[0],
        "prune_in": "the worker's process" if in_worker else "another process",
        "history_steps": steps,
        "history_runs": max(1, steps // RUN_STEPS),
        "seed_seconds": round(seed_s, 1),
        "probe": {"concurrency": WAVE, "steps_per_run": WAVE_STEPS},
        "prune": {**pruned, "seconds": round(ended - started, 2)},
        "before": _figures(before),
        "pruning": _figures(during),
        "after": _figures(after),
    }


async def _prune_child(url: str) -> None:
    store = open_store(url)
    await store.open()
    try:
        print("started", flush=True)
        removed = await prune_tenant(store, Policy(HISTORY, 0.0))
        print(json.dumps({"records": removed.records, "runs": removed.runs,
                          "stopped": removed.stopped}), flush=True)  # fmt: skip
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="an EMPTY database (default: a new SQLite file)")
    parser.add_argument("--steps", type=int, default=100_000, help="history steps to prune")
    parser.add_argument("--waves", type=int, default=5, help="probe waves before and after")
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    parser.add_argument(
        "--in-worker", action="store_true", help="prune in the probe worker's process"
    )
    parser.add_argument("--prune-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prune_child:
        asyncio.run(_prune_child(args.db))
        return

    def say(msg: str) -> None:
        if not args.json:
            print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(dir=".") as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'prune-bench.db'}"
        report = asyncio.run(run(url, args.steps, args.waves, say, args.in_worker))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
