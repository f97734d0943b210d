"""SQLite: another process's write lock never freezes the event loop, and a lock held
past the busy timeout surfaces as StoreUnavailable (a transient error to retry)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentledger.errors import StoreUnavailable
from agentledger.records import Run, Step
from agentledger.store import Batch, RunUpdate, Store, open_store
from agentledger.store._base import NewRun
from agentledger.store._sqlite import SQLiteDialect
from agentledger.worker._worker import is_transient

TARGET = "agent@1"


@contextmanager
def write_lock(path: Path, release: threading.Event) -> Iterator[threading.Event]:
    """Another connection takes the write lock (BEGIN IMMEDIATE) until ``release``."""
    locked = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait(30)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert locked.wait(10)
        yield locked
    finally:
        release.set()
        thread.join(10)


class LoopLag:
    """Measures the longest the event loop went without running a 10 ms ticker."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.worst = max(self.worst, now - last - 0.01)
            last = now

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def running_runs(store: Store, n: int) -> list[Run]:
    for _ in range(n):
        await store.create_run(NewRun(kind="agent", name="agent", version="1", input={}))
    return await store.claim_runs("w1", [TARGET], n, 60)


def journal_batch(run: Run) -> Batch:
    assert run.lease_owner is not None
    entry = Step(
        run_id=run.id,
        step_no=1,
        kind="tool",
        name="t",
        status="succeeded",
        output={"ok": True},
        lease_epoch=run.lease_epoch,
    )
    return Batch(
        run_id=run.id,
        epoch=run.lease_epoch,
        owner=run.lease_owner,
        steps=[entry],
        run=RunUpdate(step_count=1),
    )


async def test_a_held_write_lock_does_not_freeze_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        runs = await running_runs(store, 3)
        release = threading.Event()
        with write_lock(path, release), LoopLag() as lag:
            first = asyncio.ensure_future(store.commit(journal_batch(runs[0])))
            await asyncio.sleep(0.05)  # let the first group meet the lock
            later = asyncio.gather(*(store.commit(journal_batch(r)) for r in runs[1:]))
            # The loop keeps running while the lock is held: this ticker proves it.
            started = time.monotonic()
            while time.monotonic() - started < 2.0:
                await asyncio.sleep(0.05)
            assert not first.done()  # still waiting for the lock, on a thread
            release.set()
            await asyncio.wait_for(first, 10)
            await asyncio.wait_for(later, 10)
        # Generous for a shared machine, far below the 2 s the lock was held.
        assert lag.worst < 0.5, f"event loop stalled {lag.worst:.2f} s"
        for run in runs:
            assert [s.step_no for s in await store.load_journal(run.id)] == [1]
    finally:
        await store.close()


async def test_a_lock_held_past_the_busy_timeout_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    store = open_store(f"sqlite:///{path}?busy_timeout_ms=300")
    await store.open()
    try:
        (run,) = await running_runs(store, 1)
        release = threading.Event()
        with write_lock(path, release):
            with pytest.raises(StoreUnavailable, match="locked"):
                await asyncio.wait_for(store.commit(journal_batch(run)), 10)
            with pytest.raises(StoreUnavailable, match="locked"):
                await asyncio.wait_for(store.claim_runs("w1", [TARGET], 1, 60), 10)
        # Once the lock is gone, the same write goes through: the error was transient.
        await store.commit(journal_batch(run))
        assert len(await store.load_journal(run.id)) == 1
    finally:
        await store.close()


HOLD_READ_MARKS = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
# The WAL index's lock bytes start at 120: WRITE, CKPT, RECOVER, then READ0..READ4.
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 123, os.SEEK_SET)
print("held", flush=True)
sys.stdin.read()
"""


def locking_protocol_error(path: Path) -> sqlite3.OperationalError:
    """A real SQLITE_PROTOCOL: another process holds every read mark of the WAL index,
    so a reader retries (SQLite's own ~10 s of backoff) and gives up with it."""
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("CREATE TABLE t (x)")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_READ_MARKS, f"{path}-shm"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        reader = sqlite3.connect(path, isolation_level=None)
        try:
            reader.execute("SELECT * FROM t").fetchall()
        except sqlite3.OperationalError as exc:
            return exc
        finally:
            reader.close()
        raise AssertionError("the reader got its read lock")
    finally:
        holder.communicate(timeout=10)  # closes its stdin (it lets go) and its stdout
        writer.close()


def test_a_real_locking_protocol_error_is_a_transient_lock_error(tmp_path: Path) -> None:
    """SQLITE_PROTOCOL is contention on the WAL index, like SQLITE_BUSY: retried later,
    never a store failure that stops a worker."""
    exc = locking_protocol_error(tmp_path / "wal.db")
    assert exc.sqlite_errorcode == 15 and "locking protocol" in str(exc)
    dialect = SQLiteDialect(f"sqlite:///{tmp_path / 'wal.db'}")
    assert dialect.is_locked(exc)
    translated = dialect.translate(exc)
    assert isinstance(translated, StoreUnavailable)
    assert is_transient(translated)


@pytest.mark.parametrize(
    ("code", "text"),
    [(15, "locking protocol"), (5, "database is locked"), (6, "database table is locked")],
)
def test_lock_errors_are_told_by_their_code(code: int, text: str, tmp_path: Path) -> None:
    dialect = SQLiteDialect(f"sqlite:///{tmp_path / 'x.db'}")
    exc = sqlite3.OperationalError(text)
    exc.sqlite_errorcode = code
    assert dialect.is_locked(exc) and isinstance(dialect.translate(exc), StoreUnavailable)
    other = sqlite3.OperationalError("no such table: t")
    other.sqlite_errorcode = 1
    assert not dialect.is_locked(other)
    assert not isinstance(dialect.translate(other), StoreUnavailable)
