"""PostgreSQL: throughput of several worker processes draining pre-submitted runs."""

from __future__ import annotations

import asyncio
import json
import os
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


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of ``pids`` (those still running) from /proc; 0 where there is
    no /proc (the server on another host)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (after pid and comm)
    return total / _CLK_TCK


def _pg_server_sample(url: str) -> dict[str, Any]:
    """What the server did so far: this database's commits, the cluster's WAL writes,
    syncs and bytes (pg_stat_wal, PostgreSQL 14+), and the pids of this database's
    backends (their CPU is read from /proc when the server runs on this host)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        out: dict[str, Any] = {"commits": int(row[0]) if row else 0}
        try:
            wal = conn.execute(
                "SELECT wal_records, wal_bytes, wal_write, wal_sync FROM pg_stat_wal"
            )
            w = wal.fetchone()
        except psycopg.Error:
            w = None
        if w is not None:
            out.update(wal_records=int(w[0]), wal_bytes=int(w[1]), wal_writes=int(w[2]))
            out["wal_syncs"] = int(w[3])
        found = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
        out["backends"] = [int(r[0]) for r in found]
    return out


def _record_costs(
    costs: dict[str, Any],
    before: dict[str, Any],
    after: dict[str, Any],
    cpu: tuple[float, float],
    wall: float,
    total: int,
) -> None:
    costs["wall_s"] = round(wall, 3)
    costs["worker_cpu_us_per_step"] = round(cpu[0] / total * 1e6, 1)
    costs["server_cpu_us_per_step"] = round(cpu[1] / total * 1e6, 1)
    costs["server_backends"] = len(before["backends"])
    for name in ("commits", "wal_records", "wal_bytes", "wal_writes", "wal_syncs"):
        if name in before and name in after:
            costs[f"{name}_per_step"] = round((after[name] - before[name]) / total, 3)


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
    costs: dict[str, Any] | None = None,
) -> float:
    """Steps/s of ``procs`` worker subprocesses draining ``runs`` pre-submitted runs.

    The runs wait at a gate (a file) until every worker process is up, so that
    process startup is not measured; steps/s = all steps / (last step end - first
    step start), on the wall clock shared by the processes.

    ``costs`` (a dict) receives what the drain cost per step, from the gate to the last
    run done: CPU of the worker processes and of this database's server backends (from
    /proc: the server on this host), this database's commits, and the cluster's WAL
    records, bytes, writes and syncs (pg_stat_wal: other databases' writes count too).
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
        before = await asyncio.to_thread(_pg_server_sample, url)
        workers_cpu = _cpu_seconds(list(pids))
        server_cpu = _cpu_seconds(before["backends"])
        started = time.monotonic()
        gate.touch()
        deadline = time.monotonic() + timeout
        while await asyncio.to_thread(_pg_poll_done, url, ids) < len(ids):
            if time.monotonic() > deadline:
                raise RuntimeError("benchmark runs on worker processes did not finish")
            await asyncio.sleep(0.1)
        wall = time.monotonic() - started
        cpu = (
            _cpu_seconds(list(pids)) - workers_cpu,
            _cpu_seconds(before["backends"]) - server_cpu,
        )
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
    if costs is not None:
        # Read after the worker processes are gone: a backend reports its counters when
        # it disconnects (and at most once a second while it works).
        await asyncio.sleep(0.5)
        after = await asyncio.to_thread(_pg_server_sample, url)
        _record_costs(costs, before, after, cpu, wall, runs * steps)
    results = await asyncio.to_thread(_pg_results, url, ids)
    bad = [s for s, _ in results if s != RunStatus.COMPLETED]
    if bad:
        raise RuntimeError(f"{len(bad)} benchmark runs on worker processes ended {bad[0]}")
    span = max(r["t_last"] for _, r in results) - min(r["t_first"] for _, r in results)
    return runs * steps / span
