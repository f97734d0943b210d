"""Group commit: many runs' fenced journal batches in one durable transaction.

Each batch of a group runs under its own savepoint, so a batch whose fence fails
(its run's lease epoch moved on) or whose effect key is taken is rolled back
alone while the others commit. Every caller is answered only after COMMIT
returned -- after the transaction is durable; no step is acknowledged before.

Two drivers use these functions: the store's writer thread (every backend), and
for SQLite the :class:`InlineCommitter`, which commits on the event loop's own
thread. On one host a SQLite commit is a local fsync, so doing it in the loop
saves two thread hand-offs per journal write; batches submitted while the loop
runs its ready callbacks are flushed together, so concurrent runs still share
one fsync.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentledger.errors import AgentLedgerError, LeaseLost
from agentledger.store.base import EffectClaimed
from agentledger.store.dialect import Dialect


class Reply(Protocol):
    """Where a job's answer goes."""

    def done(self) -> bool: ...
    def set_result(self, value: Any) -> None: ...
    def set_exception(self, exc: BaseException) -> None: ...


class ThreadReply:
    """An answer handed from the writer thread to the caller's event loop.

    Cheaper than ``asyncio.wrap_future(concurrent.futures.Future())``: one
    ``call_soon_threadsafe`` per answer and no chained callbacks.
    """

    __slots__ = ("_done", "_loop", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, value: Any) -> None:
        self._done = True
        self._loop.call_soon_threadsafe(settle, self.future, value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._done = True
        self._loop.call_soon_threadsafe(settle, self.future, None, exc)


class LocalReply:
    """An answer given on the caller's own loop thread."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, value: Any) -> None:
        settle(self.future, value, None)

    def set_exception(self, exc: BaseException) -> None:
        settle(self.future, None, exc)


def settle(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():  # cancelled by its caller meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


@dataclass
class Job:
    """One unit of store work: ``fn(connection)`` and where its answer goes."""

    fn: Callable[[Any], Any]
    future: Reply
    write: bool
    grouped: bool
    batch: Any = None  # the Batch a grouped job applies, for dialects with plain batches


def rollback(dialect: Dialect, conn: Any) -> None:
    with contextlib.suppress(Exception):
        dialect.rollback(conn)


def run_single(
    dialect: Dialect, conn: Any, job: Job, translate: Callable[[BaseException], BaseException]
) -> None:
    """One job in its own transaction. Re-raises disconnects for the caller to retry."""
    try:
        if job.write:
            dialect.begin_write(conn)
        result = job.fn(conn)
        dialect.commit(conn)
    except (AgentLedgerError, EffectClaimed) as exc:
        rollback(dialect, conn)
        job.future.set_exception(exc)
        return
    except Exception as exc:
        rollback(dialect, conn)
        if dialect.is_disconnect(exc) or dialect.is_transient(exc):
            raise  # the caller reconnects or retries
        job.future.set_exception(translate(exc))
        return
    job.future.set_result(result)


def run_group(dialect: Dialect, conn: Any, jobs: list[Job], sizes: MutableSequence[int]) -> None:
    """Commit every batch of ``jobs`` in one transaction; answer each after COMMIT.

    A driver error fails the whole group: it is rolled back and re-raised.
    Batches are applied in run-id order, the order every multi-row writer uses, so
    two processes' groups cannot deadlock on each other's rows.
    """
    jobs = sorted(jobs, key=_run_order)
    if len(jobs) == 1:
        _run_one(dialect, conn, jobs[0], sizes)
        return
    outcomes: list[tuple[Job, BaseException | None]] = []
    dialect.begin_write(conn)
    try:
        for i, job in enumerate(jobs):
            savepoint = f"b{i}"
            dialect.execute(conn, f"SAVEPOINT {savepoint}")
            try:
                job.fn(conn)
                dialect.execute(conn, f"RELEASE SAVEPOINT {savepoint}")
                outcomes.append((job, None))
            except (LeaseLost, EffectClaimed) as refused:
                dialect.execute(conn, f"ROLLBACK TO SAVEPOINT {savepoint}")
                dialect.execute(conn, f"RELEASE SAVEPOINT {savepoint}")
                outcomes.append((job, refused))
        dialect.commit(conn)
    except Exception:
        rollback(dialect, conn)
        raise
    sizes.append(len(jobs))
    for job, failure in outcomes:  # durable now: acknowledge every batch
        if failure is None:
            job.future.set_result(None)
        else:
            job.future.set_exception(failure)


def _run_order(job: Job) -> str:
    return str(getattr(job.batch, "run_id", ""))


def _run_one(dialect: Dialect, conn: Any, job: Job, sizes: MutableSequence[int]) -> None:
    # A group of one needs no savepoint: a failed fence rolls back the whole
    # transaction, which holds nothing else. Two statements fewer per step.
    dialect.begin_write(conn)
    try:
        job.fn(conn)
        dialect.commit(conn)
    except (LeaseLost, EffectClaimed) as exc:
        rollback(dialect, conn)
        sizes.append(1)
        job.future.set_exception(exc)
        return
    except Exception:
        rollback(dialect, conn)
        raise
    sizes.append(1)
    job.future.set_result(None)  # durable now


class InlineCommitter:
    """Group commit on the event loop's thread, for a local SQLite file."""

    def __init__(
        self,
        dialect: Dialect,
        sizes: MutableSequence[int],
        translate: Callable[[BaseException], BaseException],
    ) -> None:
        self.dialect = dialect
        self.sizes = sizes
        self.translate = translate
        self._conn: Any = None
        self._pending: list[Job] = []
        self._scheduled = False

    def open(self) -> None:
        self._conn = self.dialect.connect()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self.dialect.close(self._conn)
            self._conn = None

    def submit(self, fn: Callable[[Any], Any], batch: Any = None) -> asyncio.Future[Any]:
        """Queue a fenced batch; it commits with the others ready in this loop turn."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append(Job(fn, LocalReply(future), True, True, batch))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def flush(self) -> None:
        """Commit what is pending now (the loop normally calls this itself)."""
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        jobs, self._pending, self._scheduled = self._pending, [], False
        if not jobs:
            return
        try:
            run_group(self.dialect, self._conn, jobs, self.sizes)
        except Exception as exc:
            error = self.translate(exc)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
