"""Group commit: many runs' fenced journal batches in one durable transaction.

Every journal batch reaches the database through a :class:`JournalCommitter`. A
store keeps an ordered list of them and gives each batch to the first that
``accepts`` it:

- SQLite: the :class:`InlineCommitter`, on the event loop's own thread. On one host
  a SQLite commit is a local fsync, so doing it in the loop saves two thread
  hand-offs per journal write; batches submitted while the loop runs its ready
  callbacks are flushed together, so concurrent runs still share one fsync.
- PostgreSQL: the event-loop committer of plain batches
  (:mod:`agentledger.store._postgres.async_commit`), then the writer thread for the
  batches that need more than one statement.
- Any dialect: the store's writer thread, which takes every batch.

A batch whose fence fails (its run's lease epoch moved on) is refused before it
writes anything, and one whose effect key is taken runs under its own savepoint,
so either is rolled back alone while the others commit. Every caller is answered only after COMMIT
returned -- after the transaction is durable; no step is acknowledged before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentledger.errors import AgentLedgerError, LeaseLost
from agentledger.store._base import Batch, KeyHeld
from agentledger.store._dialect import Dialect, WouldBlock
from agentledger.store._queries.journal import (
    apply_batch,
    committed,
    fence_batch,
    refused_before_writing,
    write_fenced,
)
from agentledger.store._tx import Tx


class JournalCommitter(Protocol):
    """One route of journal batches to the database (see the module docstring)."""

    def accepts(self, batch: Batch) -> bool:
        """Whether this committer can commit ``batch`` (else the next one is asked)."""
        ...

    async def commit(self, batch: Batch) -> None:
        """Commit ``batch`` with whatever else is ready; return once it is durable.

        Raises :class:`LeaseLost` when the batch's fence fails, :class:`KeyHeld`
        (:class:`EffectClaimed`, :class:`OutboxKeyTaken`) when a key it writes is
        taken, and the store's error for anything else; a refused batch wrote nothing.
        """
        ...

    async def close(self) -> None:
        """Commit what was submitted, then release the connection."""
        ...


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
        self._loop.call_soon_threadsafe(resolve_future, self.future, value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._done = True
        self._loop.call_soon_threadsafe(resolve_future, self.future, None, exc)


class LocalReply:
    """An answer given on the caller's own loop thread -- or, once ``loop`` is set (the
    job was handed to a thread), from that thread through the loop."""

    __slots__ = ("_done", "future", "loop")

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future
        self.loop: asyncio.AbstractEventLoop | None = None
        self._done = False

    def done(self) -> bool:
        return self._done or self.future.done()

    def set_result(self, value: Any) -> None:
        self._answer(value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._answer(None, exc)

    def _answer(self, value: Any, exc: BaseException | None) -> None:
        self._done = True
        if self.loop is None:
            resolve_future(self.future, value, exc)
        else:
            self.loop.call_soon_threadsafe(resolve_future, self.future, value, exc)


def resolve_future(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():  # cancelled by its caller meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


NOT_DONE: Any = object()
"""What a job's ``recover`` returns when the first attempt did not commit."""


@dataclass
class Job:
    """One unit of store work: ``fn(tx)`` and where its answer goes."""

    fn: Callable[[Tx], Any]
    future: Reply
    write: bool
    grouped: bool
    # The Batch a grouped job applies (its ``fn`` is ``apply_batch`` of it: a group may
    # apply a plain batch in two parts, its fence then its writes with the others').
    batch: Any = None
    # Before a job runs again after a lost connection (its COMMIT may have committed
    # with the reply lost): ``recover(tx)`` returns the first attempt's answer if it
    # committed, else NOT_DONE. Jobs without one are idempotent as they are.
    recover: Callable[[Tx], Any] | None = None
    retried: bool = False


def rollback(tx: Tx) -> None:
    with contextlib.suppress(Exception):
        tx.dialect.rollback(tx.conn)


def run_single(tx: Tx, job: Job, translate: Callable[[BaseException], BaseException]) -> None:
    """One job in its own transaction. Re-raises disconnects for the caller to retry."""
    try:
        if job.write:
            tx.dialect.begin_write(tx.conn)
        result = NOT_DONE
        if job.retried and job.recover is not None:
            result = job.recover(tx)
        if result is NOT_DONE:
            result = job.fn(tx)
        tx.dialect.commit(tx.conn)
    except (AgentLedgerError, KeyHeld) as exc:
        rollback(tx)
        job.future.set_exception(exc)
        return
    except Exception as exc:
        rollback(tx)
        if tx.dialect.is_disconnect(exc) or tx.dialect.is_transient(exc):
            raise  # the caller reconnects or retries
        job.future.set_exception(translate(exc))
        return
    job.future.set_result(result)


def run_group(
    tx: Tx,
    jobs: list[Job],
    sizes: MutableSequence[int],
    translate: Callable[[BaseException], BaseException],
) -> None:
    """Commit every batch of ``jobs`` in one transaction; answer each after COMMIT.

    Batches are fenced in run-id order, the order every multi-row writer uses, so
    two processes' groups cannot deadlock on each other's rows; the writes of those
    refused only by their fence follow together (``journal.write_fenced``: one
    ``executemany`` for the group's step rows, one for its events). A lost connection or a
    deadlock fails the whole group (rolled back, re-raised for the caller to retry);
    any other error falls back to one transaction per batch, so the one batch the
    database refuses fails alone and the innocent ones commit.
    """
    jobs = sorted(jobs, key=_run_order)
    if any(j.retried for j in jobs):
        jobs = _skip_committed(tx, jobs)
    if len(jobs) == 1:
        _run_one(tx, jobs[0], sizes)
        return
    if not jobs:
        return
    outcomes: list[tuple[Job, BaseException | None]] = []
    tx.dialect.begin_write(tx.conn)
    try:
        fenced: list[Job] = []
        # A run with a batch that claims a key has all its batches applied whole: that
        # batch's writes happen in the loop, between the fences of the run's plain ones,
        # and the seqs read back after the fences (``journal.write_fenced``) are
        # counted over the deferred batches of a run only.
        keyed = {
            job.batch.run_id
            for job in jobs
            if isinstance(job.batch, Batch) and not refused_before_writing(job.batch)
        }
        for i, job in enumerate(jobs):
            if refused_before_writing(job.batch) and job.batch.run_id not in keyed:
                # Refused only by its fence, before it writes anything: no savepoint
                # (two statements fewer). Its writes join the others fenced so, after
                # the loop: the group's step rows, and its events, one statement each.
                try:
                    fence_batch(tx, job.batch)
                    fenced.append(job)
                except LeaseLost as refused:
                    outcomes.append((job, refused))
                continue
            savepoint = f"b{i}"
            tx.execute(f"SAVEPOINT {savepoint}")
            try:
                job.fn(tx)
                tx.execute(f"RELEASE SAVEPOINT {savepoint}")
                outcomes.append((job, None))
            except (LeaseLost, KeyHeld) as refused:
                tx.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
                tx.execute(f"RELEASE SAVEPOINT {savepoint}")
                outcomes.append((job, refused))
        if fenced:
            write_fenced(tx, [job.batch for job in fenced])
            outcomes += [(job, None) for job in fenced]
        tx.dialect.commit(tx.conn)
    except Exception as exc:
        rollback(tx)
        if (
            isinstance(exc, WouldBlock)
            or tx.dialect.is_disconnect(exc)
            or tx.dialect.is_transient(exc)
        ):
            raise
        _one_by_one(tx, jobs, sizes, translate)
        return
    sizes.append(len(jobs))
    for job, failure in outcomes:  # durable now: acknowledge every batch
        if failure is None:
            job.future.set_result(None)
        else:
            job.future.set_exception(failure)


def _one_by_one(
    tx: Tx,
    jobs: list[Job],
    sizes: MutableSequence[int],
    translate: Callable[[BaseException], BaseException],
) -> None:
    """The fallback of a failed group: each batch in its own transaction."""
    for job in jobs:
        try:
            _run_one(tx, job, sizes)
        except Exception as exc:
            if isinstance(exc, WouldBlock) or tx.dialect.is_disconnect(exc):
                raise  # the rest is retried (the ones answered are left out)
            if tx.dialect.is_transient(exc):
                raise
            if not job.future.done():
                job.future.set_exception(translate(exc))


def _skip_committed(tx: Tx, jobs: list[Job]) -> list[Job]:
    """Answer the jobs whose batch already committed (a lost COMMIT reply); return the rest.

    In a group that committed, the batches refused by their fence wrote nothing and are
    refused again when applied again, so re-applying the rest is exact.

    A run's row keeps only its last batch's token. Run again after a lost connection,
    the jobs were tried together (or one by one in order): an earlier plain batch of a
    committed one's run, lease epoch and owner committed with it (its fence passed, or
    the later one's could not have: no fence makes a run running again), so it is not
    applied a second time either. Not so for batches the engine sent again
    (``Batch.resent``): their failed attempts may have been in different groups.
    """
    done = committed(tx, [j.batch for j in jobs if j.batch is not None])
    tx.dialect.commit(tx.conn)
    later: set[tuple[str, int, str]] = set()  # writers of a committed batch seen so far
    rest = []
    for job in reversed(jobs):  # a run's later batches first
        batch = job.batch
        if batch is not None and batch.token in done:
            job.future.set_result(None)
            if not batch.resent:
                later.add(_writer(batch))
        elif refused_before_writing(batch) and not batch.resent and _writer(batch) in later:
            job.future.set_result(None)
        else:
            rest.append(job)
    return rest[::-1]


def _writer(batch: Batch) -> tuple[str, int, str]:
    return batch.run_id, batch.epoch, batch.owner


def _run_order(job: Job) -> str:
    return str(getattr(job.batch, "run_id", ""))


def _run_one(tx: Tx, job: Job, sizes: MutableSequence[int]) -> None:
    # A group of one needs no savepoint: a failed fence rolls back the whole
    # transaction, which holds nothing else. Two statements fewer per step.
    tx.dialect.begin_write(tx.conn)
    try:
        job.fn(tx)
        tx.dialect.commit(tx.conn)
    except (LeaseLost, KeyHeld) as exc:
        rollback(tx)
        sizes.append(1)
        job.future.set_exception(exc)
        return
    except Exception:
        rollback(tx)
        raise
    sizes.append(1)
    job.future.set_result(None)  # durable now


class InlineCommitter:
    """Group commit on the event loop's thread, for a local SQLite file.

    The loop never waits for another process's write lock: its connection begins
    with no busy timeout, and when the lock is held elsewhere (a second worker on the
    same file) the group is handed to a thread that waits with the busy timeout.
    Meanwhile heartbeats, claims and other runs go on; batches submitted during the
    wait are committed by the next group, after the thread is done.
    """

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
        self._waiting: asyncio.Future[None] | None = None  # a group waiting on a thread

    def open(self) -> None:
        self._conn = self.dialect.connect()
        self.dialect.set_nowait(self._conn, True)

    def accepts(self, batch: Batch) -> bool:
        return True  # every batch of the file

    async def commit(self, batch: Batch) -> None:
        await self.submit(lambda tx: apply_batch(tx, batch), batch)

    async def close(self) -> None:
        await self.drain()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self.dialect.close(self._conn)
            self._conn = None

    async def drain(self) -> None:
        """Commit everything submitted so far (waiting for a handed-off group)."""
        while self._waiting is not None or self._pending:
            if self._waiting is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._waiting)
                # Awaiting a done future does not yield; its done callback (which clears
                # ``_waiting``) runs only once the loop gets a turn: give it one.
                await asyncio.sleep(0)
                continue
            self._flush()

    def submit(self, fn: Callable[[Tx], Any], batch: Any = None) -> asyncio.Future[Any]:
        """Queue a fenced batch; it commits with the others ready in this loop turn."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        job = Job(fn, LocalReply(future), True, True, batch)
        job.retried = bool(getattr(batch, "resent", False))  # Batch.resent: look first
        self._pending.append(job)
        self._schedule(loop)
        return future

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._scheduled and self._waiting is None:
            self._scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._waiting is not None:
            return  # the thread owns the connection; its end schedules the next group
        jobs, self._pending = self._pending, []
        if not jobs:
            return
        try:
            run_group(Tx(self.dialect, self._conn), jobs, self.sizes, self.translate)
        except WouldBlock:
            self._hand_off([j for j in jobs if not j.future.done()])
        except Exception as exc:
            error = self.translate(exc)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)

    def _hand_off(self, jobs: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        for job in jobs:  # answered from the thread from now on
            assert isinstance(job.future, LocalReply)
            job.future.loop = loop
        self._waiting = loop.run_in_executor(None, self._commit_waiting, jobs)
        self._waiting.add_done_callback(lambda _f: self._handed_back(loop))

    def _commit_waiting(self, jobs: list[Job]) -> None:
        """On a thread: the group again, this time waiting for the lock (busy timeout)."""
        self.dialect.set_nowait(self._conn, False)
        try:
            run_group(Tx(self.dialect, self._conn), jobs, self.sizes, self.translate)
        except Exception as exc:
            error = self.translate(exc)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
        finally:
            self.dialect.set_nowait(self._conn, True)

    def _handed_back(self, loop: asyncio.AbstractEventLoop) -> None:
        self._waiting = None
        if self._pending:
            self._schedule(loop)
