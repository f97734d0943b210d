"""A heartbeat whose renewal fails for a lock another session holds (SQLite's write
lock past the busy timeout; a PostgreSQL row lock past ``lock_timeout``): a transient
store error, never a lost lease. No execution is stopped, the worker does not fail, and
the next heartbeat after the lock goes renews the lease. Real stores, the real worker's
heartbeat loop."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agentledger import App, Worker, WorkerConfig
from agentledger.store import NewRun, Store, open_store
from agentledger.store._postgres import connect

TARGET = "agent@1"


@contextmanager
def sqlite_write_lock(path: Path) -> Iterator[None]:
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait(60)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert locked.wait(10)
        yield
    finally:
        release.set()
        thread.join(10)


@contextmanager
def pg_row_lock(url: str, run_id: str) -> Iterator[None]:
    conn = connect(url)
    try:
        conn.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (run_id,))
        yield
    finally:
        conn.rollback()
        conn.close()


async def until(predicate: Any, timeout: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_renewal_failing_on_a_held_lock_is_retried_not_reported_lost(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    if backend == "postgres":
        base = str(request.getfixturevalue("pg_url"))
        url = f"{base}?options=-c%20lock_timeout%3D200ms"
    else:
        path = tmp_path / "agentledger.db"
        url = f"sqlite:///{path}?busy_timeout_ms=200"
    store: Store = open_store(url)
    await store.open()
    config = WorkerConfig(lease_seconds=30.0, heartbeat_seconds=0.05)
    worker = Worker(store, App("renewal-failures"), config)
    execution = asyncio.create_task(asyncio.sleep(3600))
    beats: asyncio.Task[None] | None = None
    try:
        await store.create_run(NewRun(kind="agent", name="agent", version="1", input={}))
        (run,) = await store.claim_runs(worker.owner, [TARGET], 1, 30.0)
        worker.active[run.id] = (execution, run.lease_epoch)
        lock = pg_row_lock(url, run.id) if backend == "postgres" else sqlite_write_lock(path)
        with caplog.at_level(logging.DEBUG, logger="agentledger"):
            with lock:
                beats = asyncio.create_task(worker._heartbeat_loop())
                # A heartbeat met the lock: the store failure is logged, and retried
                # (or, were it taken for a lasting error, the worker fails).
                assert await until(
                    lambda: (
                        worker._failure is not None
                        or any("retrying" in r.getMessage() for r in caplog.records)
                    )
                )
                assert not execution.done()
                assert worker.active[run.id] == (execution, run.lease_epoch)
                assert worker._failure is None and not beats.done()
            before = (await store.get_run(run.id)).lease_expires_at  # type: ignore[union-attr]

            async def renewed() -> bool:
                now = await store.get_run(run.id)
                return now is not None and (now.lease_expires_at or 0) > (before or 0)

            deadline = asyncio.get_running_loop().time() + 20
            while not await renewed():
                assert asyncio.get_running_loop().time() < deadline, "never renewed"
                await asyncio.sleep(0.02)
        lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
        assert lost == []
        assert not execution.done() and worker._failure is None and not beats.done()
    finally:
        worker._drained.set()
        if beats is not None:
            await asyncio.gather(beats, return_exceptions=True)
        execution.cancel()
        await asyncio.gather(execution, return_exceptions=True)
        await store.close()
