"""kill -9 -> resume, the same traced run on every system.

Each round: process A runs a long run of traced 5 ms steps (``ticks.py``); once A
has finished 5 steps (plus a random 0-20 ms, so that the kill lands anywhere in a
step) it gets SIGKILL. Then, depending on the case:

* ``standby``: a second process, already running before the kill, carries on the
  run by itself. agentledger: a second worker (on the same host it sees that A's
  process is gone and takes the lease at once). DBOS (without its Conductor
  service) and LangGraph have no way for a running process to take over another
  process's runs; shown as such.
* ``restart``: a new process is started right after the kill (what a supervisor
  does). agentledger: a worker. DBOS: ``DBOS.launch()``, which recovers the pending
  workflows of its executor id. LangGraph: the application invokes the run's thread
  again (``invoke(None, config)``); it has to know which threads were unfinished.

Figures: seconds from the kill to the first step started by the new process
(process start included in ``restart``) and the steps A had finished that ran again.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentledger_anchors.ticks import done_by, outcome

FINISHED_BEFORE_KILL = 5
LEASE_SECONDS = 2.0


async def _until(check: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"resume: timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))


def _kill(*procs: subprocess.Popen[bytes] | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def _agentledger_worker(url: str) -> list[str]:
    return [
        sys.executable, "-m", "agentledger.cli._main", "worker",
        "--app", "agentledger_anchors.al_app:app", "--db", url,
        "--poll-seconds", "0.05", "--no-outbox", "--concurrency", "4",
        "--lease-seconds", str(LEASE_SECONDS),
    ]  # fmt: skip


def _child(system: str, args: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "agentledger_anchors.child", system, "tick", json.dumps(args)]


async def _kill_when_going(first: subprocess.Popen[bytes], trace: Path) -> float:
    async def going() -> bool:
        if first.poll() is not None:
            raise RuntimeError(f"resume: the first process exited ({first.returncode})")
        return done_by(trace, first.pid) >= FINISHED_BEFORE_KILL

    await _until(going, 120, "the first process to run its steps")
    await asyncio.sleep(random.uniform(0, 0.02))
    killed_at = time.time()
    first.send_signal(signal.SIGKILL)
    first.wait()
    return killed_at


async def _resumed(trace: Path, first: subprocess.Popen[bytes], killed_at: float) -> Any:
    async def check() -> Any:
        return outcome(trace, first.pid, killed_at)

    return await _until(check, 90, "the run to resume")


async def agentledger_round(url: str, workdir: Path, case: str) -> dict[str, Any]:
    from agentledger.store import open_store
    from agentledger_anchors.al_app import app

    trace = workdir / "trace"
    store = open_store(url)
    await store.open()
    first = second = None
    try:
        run_id = await app.submit(store, "anchors_ticks", {"path": str(trace)})
        first = _spawn(_agentledger_worker(url), workdir / "a.log")
        if case == "standby":
            started = first

            async def claimed() -> bool:  # else the standby could take the run first
                return done_by(trace, started.pid) >= 1

            await _until(claimed, 120, "the first worker to start the run")
            second = _spawn(_agentledger_worker(url), workdir / "b.log")
            standby = second

            async def registered() -> bool:
                workers = await store.list_workers(live_within=30)
                return any(w.pid == standby.pid for w in workers)

            await _until(registered, 60, "the standby worker to register")
        killed_at = await _kill_when_going(first, trace)
        if case == "restart":
            second = _spawn(_agentledger_worker(url), workdir / "b.log")
        result: dict[str, Any] = await _resumed(trace, first, killed_at)
        await store.cancel_run(run_id, "benchmark round over", "bench")
        return result
    finally:
        _kill(first, second)
        await store.close()


async def other_round(
    system: str, store: str, target: str, variant: str, workdir: Path
) -> dict[str, Any]:
    trace = workdir / "trace"
    args = {"store": store, "target": target, "variant": variant, "path": str(trace)}
    args["run_key"] = f"anchors-ticks-{time.time_ns()}"
    first = second = None
    try:
        first = _spawn(_child(system, {**args, "role": "first"}), workdir / "a.log")
        killed_at = await _kill_when_going(first, trace)
        second = _spawn(_child(system, {**args, "role": "resume"}), workdir / "b.log")
        result: dict[str, Any] = await _resumed(trace, first, killed_at)
        return result
    finally:
        _kill(first, second)
