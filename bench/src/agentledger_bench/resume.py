"""Kill -> resume: how long a dead worker's run waits before another resumes it.

Each round: worker A (a subprocess) claims a run of ticking steps; a standby
worker B is started and registered; A is SIGKILLed; the figure is the time from
the kill to the start of the first step journaled under B's lease epoch.

Two cases. *Same host*: B sees that A's process is gone and expires its lease at
once. *Other host*: B runs with ``--no-reap`` (as a worker on another machine
would, which cannot see A's processes), so the run waits for A's lease to expire.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from agentledger.store._sqlstore import Store
from agentledger_bench.apps import app as bench_app
from agentledger_bench.apps import worker_command

LEASE_SECONDS = 2.0


def _worker(url: str, workdir: Path, name: str, *extra: str) -> subprocess.Popen[bytes]:
    log = open(workdir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            worker_command(
                url, "--lease-seconds", str(LEASE_SECONDS), "--concurrency", "4", *extra
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
    finally:
        log.close()


async def _until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"resume benchmark: timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def one_kill(store: Store, url: str, workdir: Path, same_host: bool) -> float:
    """Seconds from SIGKILL of the run's worker to its first resumed step."""
    run_id = await bench_app.submit(store, "bench_ticks", {"ticks": 100_000})
    first = _worker(url, workdir, "a")
    second: subprocess.Popen[bytes] | None = None
    try:

        async def claimed() -> bool:
            run = await store.get_run(run_id)
            return run is not None and run.lease_epoch == 1 and run.step_count >= 3

        await _until(claimed, 30, "the first worker to run the benchmark run")
        second = _worker(url, workdir, "b", *(() if same_host else ("--no-reap",)))

        async def registered() -> bool:
            workers = await store.list_workers(live_within=30)
            return any(w.pid == second.pid for w in workers)

        await _until(registered, 30, "the standby worker to register")
        await asyncio.sleep(0.2)  # the standby is polling now
        killed_at = time.time()
        first.send_signal(signal.SIGKILL)
        first.wait()

        async def resumed() -> float | None:
            steps = await store.load_journal(run_id)
            starts = [s.started_at for s in steps if s.lease_epoch >= 2 and s.started_at]
            return min(starts) if starts else None

        resumed_at = await _until(resumed, 60, "the run to resume")
        return float(resumed_at) - killed_at
    finally:
        await store.cancel_run(run_id, "benchmark round over", "bench")
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


async def resume_latency(store: Store, url: str, workdir: Path, kills: int) -> dict[str, Any]:
    """Median and max kill->resume seconds over ``kills`` kills, for both cases."""
    report: dict[str, Any] = {"kills": kills, "lease_seconds": LEASE_SECONDS}
    for case, same_host in (("same_host", True), ("other_host", False)):
        samples = sorted([await one_kill(store, url, workdir, same_host) for _ in range(kills)])
        report[case] = {
            "median_s": round(statistics.median(samples), 3),
            "max_s": round(samples[-1], 3),
            "samples_s": [round(s, 3) for s in samples],
        }
    return report
