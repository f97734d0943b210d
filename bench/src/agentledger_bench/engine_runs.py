"""(b)-(d): runs of the benchmark app executed by an in-process worker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agentledger.cli._ops import worker_companions
from agentledger.records import RunStatus
from agentledger.store import Store
from agentledger.worker import Worker, WorkerConfig
from agentledger_bench.apps import app as bench_app


async def execute(
    store: Store,
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

    config = WorkerConfig(
        concurrency=concurrency,
        lease_seconds=120.0,
        poll_seconds=0.01,
        reap_seconds=3600.0,
        outbox=False,
    )
    worker = Worker(store, bench_app, config, companions=worker_companions(config))
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


async def per_step_us(store: Store, name: str, steps: int) -> float:
    (result,), _ = await execute(store, name, [{"steps": steps}], concurrency=1)
    return float(result["elapsed_s"]) / steps * 1e6


async def concurrent(
    store: Store, runs: int, steps: int, name: str = "bench_read_tool"
) -> tuple[float, float, list[int]]:
    """(steps/s inside the runs, steps/s from worker start, group sizes seen) of ``runs``
    runs of the workflow ``name`` at once (a timed one of ``agentledger_bench.apps``)."""
    store.group_sizes.clear()
    results, wall = await execute(
        store, name, [{"steps": steps} for _ in range(runs)], concurrency=runs
    )
    groups = list(store.group_sizes)
    span = max(r["t_last"] for r in results) - min(r["t_first"] for r in results)
    total = runs * steps
    return total / span, total / wall, groups
