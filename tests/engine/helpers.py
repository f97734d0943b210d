"""Shared helpers of the engine tests: worker subprocesses, waits, store and ledger reads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from agentledger.records import Event, Run, RunStatus, Step
from agentledger.store import Store, open_store
from tests.apps import ledger

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.engine_app:app"
APP_V2 = "tests.apps.engine_app_v2:app"
T = TypeVar("T")
# A worker's lease when its test does not wait for one to expire: far longer than any
# stall of a loaded machine, and no longer than the outbox claims of the test apps
# (2 x their 5 s tool timeout + 1), so a killed worker's deliveries are taken as soon
# as before. Its heartbeat keeps the cadence the old 2 s lease had (cancels and
# registrations are seen as fast as before).
STALL_PROOF_LEASE = 10.0
DEFAULT_HEARTBEAT = 0.5


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Env:
    """One test's world: an agentledger database (SQLite file or PostgreSQL), a ledger file,
    worker processes."""

    def __init__(self, tmp: Path, url: str | None = None) -> None:
        self.tmp = tmp
        self.db_path = tmp / "agentledger.db"
        self.url = url or f"sqlite:///{self.db_path}"
        self.ledger = str(tmp / "ledger.db")
        self.workers: list[subprocess.Popen[bytes]] = []
        self._cleanups: list[Callable[[], object]] = []
        self._logs = 0
        # (thread, loop, store) while a wait polls through one store: see one_store().
        self._held: tuple[int, asyncio.AbstractEventLoop, Store] | None = None
        os.environ["ENGINE_LEDGER"] = self.ledger  # for in-process ledger reads

    # processes ---------------------------------------------------------------

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env["ENGINE_LEDGER"] = self.ledger
        env.pop("AGENTLEDGER_DEBUG", None)
        return env

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``agentledger ARGS`` in a subprocess and return its result."""
        return subprocess.run(
            [sys.executable, "-m", "agentledger.cli._main", *args],
            cwd=ROOT,
            env=self.child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start_worker(
        self,
        *,
        app: str = APP,
        lease: float | None = None,
        concurrency: int = 10,
        extra: tuple[str, ...] = (),
        db: str | None = None,
        prefix: tuple[str, ...] = (),
        preexec_fn: Callable[[], object] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a worker subprocess (``prefix``: e.g. ``ip netns exec NS``;
        ``preexec_fn``: run in the child before it starts, e.g. to set a resource limit).

        ``lease``: give one only when the test waits for a live (stopped, cut off) worker's
        lease to expire. Left out, the lease is :data:`STALL_PROOF_LEASE` with a heartbeat
        every :data:`DEFAULT_HEARTBEAT`: a worker the loaded machine stalls for a few
        seconds keeps its runs (with a 2 s lease a 1.4 s stall let another worker, or the
        worker itself, claim the run again: one more epoch, one more resume, a held call
        made twice). A killed worker's runs are taken at once either way (its leases are
        reaped, its process being gone), so no test waits for this lease."""
        if lease is None:
            lease = STALL_PROOF_LEASE
            if "--heartbeat-seconds" not in extra:
                extra = ("--heartbeat-seconds", str(DEFAULT_HEARTBEAT), *extra)
        self._logs += 1
        log = open(self.tmp / f"worker{self._logs}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "agentledger.cli._main",
                "worker",
                "--app",
                app,
                "--db",
                db or self.url,
                "--poll-seconds",
                "0.05",
                "--lease-seconds",
                str(lease),
                "--concurrency",
                str(concurrency),
                *extra,
            ],
            cwd=ROOT,
            env=self.child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )
        log.close()
        self.workers.append(proc)
        return proc

    def worker_log(self, n: int) -> str:
        return (self.tmp / f"worker{n}.log").read_text(errors="replace")

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL and reap (a zombie would still look alive to liveness checks)."""
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def on_close(self, cleanup: Callable[[], object]) -> None:
        """Call ``cleanup`` when the world closes (after its workers are killed)."""
        self._cleanups.append(cleanup)

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
        while self._cleanups:
            self._cleanups.pop()()

    # store ---------------------------------------------------------------------

    def _store(self, fn: Callable[[Any], Any]) -> Any:
        held = self._held
        if held is not None and held[0] == threading.get_ident():
            _, loop, store = held
            return loop.run_until_complete(fn(store))

        async def go() -> Any:
            store = open_store(self.url)
            await store.open()
            try:
                return await fn(store)
            finally:
                await store.close()

        return asyncio.run(go())

    @contextlib.contextmanager
    def one_store(self) -> Iterator[None]:
        """Inside, this thread's reads and writes go through one store, opened once.

        For a wait's polls: each read is a transaction of its own, so it sees what the
        worker processes committed since, as a store opened for it would; opening one per
        poll would only cost the test process its CPU (threads, connections, the schema
        check) while the workers it waits on need it."""
        if self._held is not None:
            yield
            return
        loop = asyncio.new_event_loop()
        store = open_store(self.url)
        try:
            loop.run_until_complete(store.open())
            self._held = (threading.get_ident(), loop, store)
            try:
                yield
            finally:
                self._held = None
                loop.run_until_complete(store.close())
        finally:
            loop.close()

    def submit(self, name: str, input: Any = None, version: str | None = None) -> str:
        from tests.apps.engine_app import app

        return str(self._store(lambda s: app.submit(s, name, input, version=version)))

    def run(self, run_id: str) -> Run:
        run = self._store(lambda s: s.get_run(run_id))
        assert run is not None
        return run

    def journal(self, run_id: str) -> list[Step]:
        return list(self._store(lambda s: s.load_journal(run_id)))

    def events(self, run_id: str) -> list[Event]:
        return list(self._store(lambda s: s.list_events(run_id)))

    def approvals(self, run_id: str) -> list[Any]:
        return list(self._store(lambda s: s.get_approvals(run_id)))

    def outbox(self, status: str | None = None) -> list[Any]:
        return list(self._store(lambda s: s.list_outbox(status)))

    def wait_status(self, run_id: str, *statuses: str, timeout: float = 30.0) -> Run:
        wanted = set(statuses) or set(RunStatus.TERMINAL)
        last: list[Run] = []

        def check() -> Run | None:
            run = self.run(run_id)
            last[:] = [run]
            return run if run.status in wanted else None

        with self.one_store():
            try:
                return wait_for(check, timeout, f"run {run_id} to be {sorted(wanted)}", 0.1)
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}; last seen {last[0] if last else None}; journal {self.journal(run_id)}"
                ) from None

    def wait_marker(self, flag: Path, timeout: float = 30.0) -> None:
        marker = Path(str(flag) + ".holding")
        wait_for(marker.exists, timeout, f"the tool to hold on {flag}")

    def hold_flag(self, name: str) -> Path:
        """A fresh hold flag: a run input naming it holds the step while the file exists."""
        flag = self.tmp / f"{name}.flag"
        flag.write_text("hold")
        Path(str(flag) + ".holding").unlink(missing_ok=True)
        return flag

    def stop_after_heartbeat(self, proc: subprocess.Popen[bytes], run_id: str) -> None:
        """SIGSTOP ``proc`` just after it renewed its lease on ``run_id``.

        Its next heartbeat is then a whole interval after anything else it was
        waiting on (a held step polls every 20 ms): on SIGCONT the held step
        resumes and writes before the heartbeat can notice the lease is gone, so
        it is the journal fence, not the heartbeat, that must turn the write away.

        On SQLite, a process stopped inside a write transaction holds the database's one
        write lock until it runs again, so no other worker could even register: this is
        the file-lock nature of the embedded backend, not what the fence tests are about.
        The stop is retried until it lands outside a write transaction.
        """
        with self.one_store():
            for _ in range(50):
                first = self.run(run_id).lease_expires_at
                wait_for(
                    lambda first=first: self.run(run_id).lease_expires_at != first,
                    10,
                    "the worker to renew its lease",
                    0.01,
                )
                proc.send_signal(signal.SIGSTOP)
                # The lock is looked at once every thread has stopped: a thread still
                # running (in a system call, or not yet scheduled) could take it after.
                wait_for(lambda: _all_threads_stopped(proc.pid), 10, "the worker to stop", 0.01)
                if not self.url.startswith("sqlite") or self._write_lock_free():
                    return
                proc.send_signal(signal.SIGCONT)
        raise AssertionError("the worker was inside a write transaction at every stop")

    def _write_lock_free(self) -> bool:
        """Whether another connection can take SQLite's write lock right now."""
        conn = sqlite3.connect(self.db_path, timeout=0.5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    def lease_lost_by_fence(self, n: int) -> bool:
        """True when worker ``n`` (started with ``-v``) had a journal write rejected."""
        return "abandoned: lease lost" in self.worker_log(n)

    # ledger -------------------------------------------------------------------

    def effects(self, kind: str | None = None) -> dict[str, int]:
        return ledger.effect_counts(self.ledger, kind)

    def calls(self, kind: str | None = None) -> dict[str, int]:
        return ledger.call_counts(self.ledger, kind)

    def call_times(self, key: str) -> list[float]:
        return [at for _, _, at in ledger.calls(self.ledger, key=key)]


def steps_by_name(journal: list[Step]) -> dict[str, Step]:
    return {s.name if s.kind != "tool" else f"{s.name}#{s.step_no}": s for s in journal}


def tool_steps(journal: list[Step], name: str | None = None) -> list[Step]:
    return [s for s in journal if s.kind == "tool" and (name is None or s.name == name)]


def no_traceback(text: str) -> bool:
    return "Traceback" not in text


def parse_json(text: str) -> Any:
    return json.loads(text)


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped by a signal (state ``T``)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        states.append(stat[stat.rindex(")") + 2])  # the field after the command name
    return bool(states) and all(state == "T" for state in states)
