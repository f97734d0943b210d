"""PostgreSQL: throughput of several worker processes draining pre-submitted runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from agentledger.records import RunStatus
from agentledger.store import Store
from agentledger_bench.apps import app as bench_app
from agentledger_bench.apps import worker_command


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
    store: Store,
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
    command = worker_command(url, "--concurrency", str(concurrency))
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
