"""The :class:`Store`: one class over any SQL dialect, with group commit (groupcommit.py).

Store operations are plain functions ``op(tx, ...)`` (:mod:`agentledger.store._tx`).
Claims, heartbeats and the other non-journal writes (:meth:`Store.transact`) go through
one writer thread that owns one connection, each job in its own transaction. The
read-only transactions of :meth:`Store.read` (the HTTP service's GETs, key lookups,
event-stream polls) go through read threads with a connection each -- one to
start with, more (up to the dialect's ``read_connections``) while every one is busy,
the extra ones closed again after :data:`READER_IDLE_SECONDS` without work --
so writes never queue behind them nor they behind writes (SQLite in WAL mode reads while
another connection writes; PostgreSQL reads what is committed). Every write a caller
awaited committed before its next read begins, so that read sees it. Journal batches
go through the store's :class:`~agentledger.store._groupcommit.JournalCommitter`
list: the dialect's event-loop committer first (SQLite: every batch; PostgreSQL:
the batches that fit in one statement), then the writer thread, which takes the
rest. Every committer commits in groups (many runs' batches in ONE transaction,
each under a savepoint, so a batch whose fence fails is rolled back alone).
Callers are resumed only after COMMIT returned, i.e. after the transaction is
durable -- no step is acknowledged before that.

A batch is validated (encoded) before it joins a group, and a group the database
refuses falls back to one transaction per batch: one poisoned batch fails alone.

Every job is safe to run again after a lost connection, whose COMMIT may have
committed with the reply lost: submits carry a request id (and meet a concurrent
submit of the same id on its unique index), claims of runs and outbox rows, journal
batches, releases and appended events a token written with them, and the other
operations are idempotent as they are (absolute values, fenced or guarded updates, a
decision repeated by its decider, an effect swap that recognises its own row).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload
from urllib.parse import urlsplit, urlunsplit

from agentledger._failures import cause_of
from agentledger.errors import AgentLedgerError, StoreError, StoreUnavailable, UsageError
from agentledger.records import OutboxItem, Run
from agentledger.store._base import Batch, NewRun
from agentledger.store._dialect import Dialect
from agentledger.store._groupcommit import (
    NOT_DONE,
    Job,
    JournalCommitter,
    ThreadReply,
    run_group,
    run_single,
)
from agentledger.store._queries import (
    approvals,
    common,
    effect_swap,
    events,
    journal,
    migrations,
    outbox,
    restore,
    runs,
    workers,
)
from agentledger.store._retrying import Reconnect
from agentledger.store._tx import Tx

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")

#: How long a read connection beyond the first may go without work before it closes.
READER_IDLE_SECONDS = 60.0


def redacted_url(url: str) -> str:
    """A database URL fit for a message or a log line: its password shown as ``***``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}{port}"))


class SchemaMissing(UsageError):
    """A store opened without migrating found no current agentledger schema."""


class _Operation(Generic[P, T]):
    """A store operation named on :class:`Store`: ``store.get_run(run_id)`` runs
    ``runs.get_run(tx, run_id)`` in one transaction (see :func:`reads`, :func:`writes`)."""

    def __init__(self, op: Callable[Concatenate[Tx, P], T], write: bool) -> None:
        self.op = op
        self.write = write
        self.__doc__ = op.__doc__

    @overload
    def __get__(self, store: None, owner: type) -> _Operation[P, T]: ...

    @overload
    def __get__(self, store: Store, owner: type) -> Callable[P, Awaitable[T]]: ...

    def __get__(self, store: Store | None, owner: type) -> Any:
        if store is None:
            return self
        run = store.transact if self.write else store._query
        return functools.partial(run, self.op)


def reads(op: Callable[Concatenate[Tx, P], T]) -> _Operation[P, T]:
    """Name a read-only kernel operation on the store: ``get_run = reads(runs.get_run)``
    (run on the writer's connection, in order with its writes)."""
    return _Operation(op, write=False)


def writes(op: Callable[Concatenate[Tx, P], T]) -> _Operation[P, T]:
    """Name a writing operation on the store: ``cancel_run = writes(runs.cancel_run)``."""
    return _Operation(op, write=True)


class _WriterThreadCommitter:
    """Journal batches through the store's writer thread, grouped with the others
    queued there; takes every batch (the last committer asked)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def accepts(self, batch: Batch) -> bool:
        return True

    async def commit(self, batch: Batch) -> None:
        store = self._store
        await store._call(lambda tx: journal.apply_batch(tx, batch), grouped=True, batch=batch)

    async def close(self) -> None:
        """Nothing to release: the store stops its thread after the committers."""


class Store:
    """The one source of truth: runs, the step journal, leases and claims, effects,
    outbox, approvals, events. One instance per process; a backend is a
    :class:`~agentledger.store._dialect.Dialect` (``open_store`` picks it from the URL).

    A store operation is a plain function ``op(tx, ...)`` (:class:`~agentledger.store._tx.Tx`),
    run in one transaction by :meth:`transact` or :meth:`read`; the kernel's are also
    named on the store (``store.get_run(run_id)``). The one write the engine makes while
    a run executes is :meth:`commit` of a :class:`~agentledger.store._base.Batch`: every
    journal write, run counter, effect claim, outbox row, approval and audit event that
    a step decides, committed together and *fenced* by the run's lease epoch, grouped
    with other runs' batches into one durable transaction (group commit)."""

    url: str

    def __init__(self, dialect: Dialect) -> None:
        self.url = dialect.url
        self.dialect = dialect
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        # The migrations this store's open() applied (`agentledger migrate` reports them).
        self.applied: list[int] = []
        # Batches per committed group, the latest ones only (benchmarks read them).
        self.group_sizes: deque[int] = deque(maxlen=10_000)
        # Where journal batches go, asked in order (the writer thread's takes all).
        self._committers: list[JournalCommitter] = []
        # Called after each journal commit (the HTTP service's event hub).
        self._journal_hooks: list[Callable[[], None]] = []
        # The read threads (none: reads share the writer thread), how many wait for work.
        self._reads: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._readers: list[threading.Thread] = []
        self._idle_readers = 0
        self._readers_lock = threading.Lock()
        self.reader_idle_seconds = READER_IDLE_SECONDS

    # lifecycle ------------------------------------------------------------

    async def open(
        self, *, migrate: bool = True, loop_committer: bool = True, read_only: bool = False
    ) -> None:
        """Connect; create or upgrade the schema unless ``migrate`` is False (read-only
        commands), which raises :class:`SchemaMissing` when the schema is not current.

        ``read_only``: the store only reads (implies ``migrate=False``); SQLite opens the
        file read-only, so a file this process may not write can be listed.

        ``loop_committer=False``: journal batches all go through the writer thread, and
        the dialect opens no connection of its own for them -- for a store that writes
        none (``serve``'s sealer). An open() that raises leaves nothing open."""
        if self._thread is not None:
            return
        self._migrate = migrate and not read_only
        self.dialect.read_only = read_only
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._serve, args=(started,), name="agentledger-store", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.wrap_future(started)
        except BaseException:
            self._thread.join()
            self._thread = None
            raise
        try:
            on_loop = (
                await self.dialect.open_batch_committer(self.group_sizes, self._error)
                if loop_committer
                else None
            )
        except BaseException:
            # The writer is connected: stop it, or its thread and connection outlive
            # the failed open() and a later open() takes the half-open store for open.
            await self._stop_writer()
            raise
        self._committers = [c for c in (on_loop, _WriterThreadCommitter(self)) if c is not None]
        if self.dialect.separate_reads:
            self._add_reader()

    async def close(self) -> None:
        if self._thread is None:
            return
        committers, self._committers = self._committers, []
        for committer in committers:  # each commits what it holds before the thread stops
            await committer.close()
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for _ in readers:
            self._reads.put(None)
        for reader in readers:
            await asyncio.to_thread(reader.join)
        await self._stop_writer()

    async def _stop_writer(self) -> None:
        """End the writer thread (it closes its connection) and wait for it."""
        assert self._thread is not None
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    def listen(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Wake-up hints from the database (PostgreSQL LISTEN/NOTIFY); None if unsupported."""
        return self.dialect.listen(callback)

    def listen_events(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` (on another thread) when any process committed journal
        events; return a function that stops listening. None if unsupported. A hint:
        notifications sent while the listener reconnects are lost."""
        return self.dialect.listen_events(callback)

    def on_journal_commit(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook()`` on the event loop after each journal batch this store commits;
        return a function that removes it."""
        self._journal_hooks.append(hook)
        return lambda: self._journal_hooks.remove(hook)

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied."""
        return await self._call(migrations.migrate, write=False)

    # the writer thread ----------------------------------------------------

    def _serve(self, started: concurrent.futures.Future[None]) -> None:
        try:
            self._conn = self.dialect.connect()
            if getattr(self, "_migrate", True):
                self.applied = migrations.migrate(self._writer_tx())
            elif not migrations.is_current(self._writer_tx()):
                raise SchemaMissing(
                    f"no agentledger schema (or an older one) in {redacted_url(self.url)}; "
                    f"create it with `agentledger migrate --db {redacted_url(self.url)}` "
                    "(a worker or submit also creates it)"
                )
            self.dialect.after_migrate(self._conn)
        except BaseException as exc:  # surfaced to open()'s caller
            started.set_exception(self._error(exc))
            return
        started.set_result(None)
        while True:
            job = self._queue.get()
            if job is None:
                break
            jobs = [job]
            stop = False
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                jobs.append(more)
            grouped = [j for j in jobs if j.grouped]
            for j in jobs:
                if not j.grouped:
                    self._with_reconnect([j], self._run_single)
            if grouped:
                self._with_reconnect(grouped, self._run_group)
            if stop:
                break
        with contextlib.suppress(Exception):  # closing a broken connection is not worth an error
            self.dialect.close(self._conn)

    def _add_reader(self) -> None:
        with self._readers_lock:
            thread = threading.Thread(
                target=self._serve_reads, name="agentledger-store-read", daemon=True
            )
            self._readers.append(thread)
        thread.start()

    def _serve_reads(self) -> None:
        """The read connection's thread: one read-only job at a time, each in its own
        transaction. The connection is opened by the first job and reopened after a
        loss; a read is safe to run again."""
        conn: Any = None
        while True:
            with self._readers_lock:
                self._idle_readers += 1
            idle = False
            try:
                job = self._reads.get(timeout=self.reader_idle_seconds)
            except queue.Empty:
                job, idle = None, True
            with self._readers_lock:
                self._idle_readers -= 1
                if idle:
                    # A burst of reads opened extra connections; one stays open. Decided
                    # under the lock, so the last reader never leaves and a read queued
                    # meanwhile is served by the ones that stay.
                    me = threading.current_thread()
                    if len(self._readers) > 1 and me in self._readers:
                        self._readers.remove(me)
                        break
                    continue
            if job is None:
                break
            retry = Reconnect()
            while not job.future.done():
                try:
                    if conn is None:
                        conn = self.dialect.connect()
                    run_single(Tx(self.dialect, conn), job, self._error)
                except Exception as exc:
                    transient = self.dialect.is_transient(exc) and retry.may_retry_transient()
                    lost = self.dialect.is_disconnect(exc) and retry.within_window()
                    cause = self.dialect.lost_cause(conn, exc) if lost else exc
                    if not transient:  # lost, or failing to open: a new one next time
                        with contextlib.suppress(Exception):
                            if conn is not None:
                                self.dialect.close(conn)
                        conn = None
                    if not (transient or lost):
                        job.future.set_exception(self._error(exc))
                        break
                    log.warning("store read failed (%s); retrying", cause)
                    time.sleep(retry.transient_pause() if transient else retry.next_pause())
        if conn is not None:
            with contextlib.suppress(Exception):
                self.dialect.close(conn)

    def _with_reconnect(self, jobs: list[Job], runner: Callable[[list[Job]], None]) -> None:
        """Run ``jobs``; reconnect after a lost connection, retry after a deadlock."""
        retry = Reconnect()
        while True:
            jobs = [j for j in jobs if not j.future.done()]  # answered ones are settled
            if not jobs:
                return
            try:
                runner(jobs)
                return
            except Exception as exc:
                transient = self.dialect.is_transient(exc) and retry.may_retry_transient()
                lost = self.dialect.is_disconnect(exc) and retry.within_window()
                if not (transient or lost):
                    for j in jobs:
                        if not j.future.done():
                            j.future.set_exception(self._error(exc))
                    return
                if transient:
                    log.info("store transaction rolled back (%s); retrying", cause_of(exc))
                    time.sleep(retry.transient_pause())
                    continue
                log.warning(
                    "store connection lost (%s); reconnecting",
                    self.dialect.lost_cause(self._conn, exc),
                )
                for j in jobs:  # their COMMIT may have committed: recover before redoing
                    j.retried = True
                time.sleep(retry.next_pause())
                with contextlib.suppress(Exception):
                    self.dialect.close(self._conn)
                try:
                    self._conn = self.dialect.connect()
                except Exception as again:
                    log.warning("reconnect failed: %s", again)

    def _run_single(self, jobs: list[Job]) -> None:
        (job,) = jobs
        run_single(self._writer_tx(), job, self._error)

    def _run_group(self, jobs: list[Job]) -> None:
        run_group(self._writer_tx(), jobs, self.group_sizes, self._error)

    def _writer_tx(self) -> Tx:
        """A unit of work over the writer thread's current connection."""
        return Tx(self.dialect, self._conn)

    def _error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, AgentLedgerError):
            return exc
        return self.dialect.translate(exc)

    async def _call(
        self,
        fn: Callable[[Tx], T],
        *,
        write: bool = True,
        grouped: bool = False,
        batch: Batch | None = None,
        recover: Callable[[Tx], Any] | None = None,
    ) -> T:
        if self._thread is None:
            raise StoreUnavailable("the store is not open; call `await store.open()` first")
        reply = ThreadReply(asyncio.get_running_loop())
        job = Job(fn, reply, write, grouped, batch, recover)
        job.retried = batch is not None and batch.resent  # Batch.resent: look first
        self._queue.put(job)
        result: T = await reply.future
        return result

    # what a store operation adds besides its SQL -------------------------------

    async def transact(
        self, op: Callable[Concatenate[Tx, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``op(tx, *args, **kwargs)`` in ONE write transaction and return its result.

        The store begins and commits (an :class:`~agentledger.errors.AgentLedgerError`
        raised by ``op`` rolls back), and runs ``op`` again after a lost connection, so
        ``op`` must be safe to run twice (absolute values, guarded updates, or a token
        it writes and looks for)."""
        return await self._call(lambda tx: op(tx, *args, **kwargs))

    async def read(
        self, op: Callable[Concatenate[Tx, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``op(tx, *args, **kwargs)`` in ONE read-only transaction, on a read
        connection of its own when the dialect has them (see the module doc)."""
        fn: Callable[[Tx], T] = lambda tx: op(tx, *args, **kwargs)  # noqa: E731
        if not self._readers:
            return await self._call(fn, write=False)
        reply = ThreadReply(asyncio.get_running_loop())
        self._reads.put(Job(fn, reply, False, False))
        if not self._idle_readers and len(self._readers) < self.dialect.read_connections:
            self._add_reader()  # every read connection busy: one more
        result: T = await reply.future
        return result

    async def _query(
        self, op: Callable[Concatenate[Tx, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """A kernel read (:func:`reads`): on the writer thread's connection, in order with
        the writes queued there, so the engine and the worker read what they wrote
        without waiting for a read connection."""
        return await self._call(lambda tx: op(tx, *args, **kwargs), write=False)

    async def create_run(self, new: NewRun) -> Run:
        """Submit a run (queued). A retried submit (same ``request_id``) returns the run
        the first attempt created."""
        if new.request_id is None:  # fixed before the first attempt, so a retry finds it
            new = dataclasses.replace(new, request_id=common.new_id("q"))
        return await self.transact(runs.create_run, new)

    async def claim_runs(
        self, owner: str, targets: list[str], limit: int, lease_seconds: float
    ) -> list[Run]:
        """Claim up to ``limit`` runnable runs: new lease, ``lease_epoch + 1``."""
        token = common.new_token()

        def recover(tx: Tx) -> Any:
            found = runs.claimed_with(tx, owner, token)
            return NOT_DONE if found is None else found

        return await self._call(
            lambda tx: runs.claim_runs(tx, owner, targets, limit, lease_seconds, token),
            recover=recover,
        )

    async def release_run(self, run_id: str, epoch: int, owner: str) -> bool:
        """Give a run back (graceful shutdown): queued again, lease cleared."""
        token = common.new_token()

        def recover(tx: Tx) -> Any:  # released before the reply was lost: say so
            return True if events.has_event(tx, run_id, token) else NOT_DONE

        return await self._call(
            lambda tx: runs.release_run(tx, run_id, epoch, owner, token), recover=recover
        )

    async def append_event(self, run_id: str, type: str, actor: str, data: Any) -> None:
        """Append an audit event to a run's log (exactly once, also across a lost reply)."""
        token = common.new_token()

        def recover(tx: Tx) -> Any:  # appended before the reply was lost: not again
            return None if events.has_event(tx, run_id, token) else NOT_DONE

        await self._call(
            lambda tx: events.insert_event(tx, run_id, type, actor, data, token=token),
            recover=recover,
        )

    async def claim_outbox(self, owner: str, limit: int, lease_seconds: float) -> list[OutboxItem]:
        """Lease up to ``limit`` due outbox rows for delivery."""
        token = common.new_token()

        def recover(tx: Tx) -> Any:  # leased before the reply was lost: those rows
            found = outbox.claimed_outbox(tx, owner, token)
            return NOT_DONE if found is None else found

        return await self._call(
            lambda tx: outbox.claim_outbox(tx, owner, limit, lease_seconds, token),
            recover=recover,
        )

    async def commit(self, batch: Batch) -> None:
        """Commit a fenced batch durably. Raises LeaseLost, EffectClaimed, or
        UnstorableBatch (this batch alone cannot be encoded; nothing was written)."""
        journal.validate_batch(batch)  # a batch no database can store fails here, alone
        for committer in self._committers:
            if committer.accepts(batch):
                await committer.commit(batch)
                for hook in self._journal_hooks:  # committed: durable, now others may look
                    hook()
                return
        raise StoreUnavailable("the store is not open; call `await store.open()` first")

    # the kernel's operations, named on the store (each is the function it names) ----

    get_run = reads(runs.get_run)
    list_runs = reads(runs.list_runs)
    count_runs = reads(runs.count_runs)
    cancel_requests = reads(runs.cancel_requests)
    lease_owners = reads(runs.lease_owners)
    renew_leases = writes(runs.renew_leases)
    expire_leases_of = writes(runs.expire_leases_of)
    cancel_run = writes(runs.cancel_run)
    load_journal = reads(journal.load_journal)
    get_effect = reads(journal.get_effect)
    swap_effect = writes(effect_swap.swap_effect)
    list_events = reads(events.list_events)
    get_approvals = reads(approvals.get_approvals)
    decide_approval = writes(approvals.decide_approval)
    list_outbox = reads(outbox.list_outbox)
    settle_outbox = writes(outbox.settle_outbox)
    register_worker = writes(workers.register_worker)
    heartbeat_worker = writes(workers.heartbeat_worker)
    deregister_worker = writes(workers.deregister_worker)
    list_workers = reads(workers.list_workers)
    registrations = reads(workers.registrations)
    version_counts = reads(workers.version_counts)
    open_runs = reads(workers.open_runs)
    mark_restored = writes(restore.mark_restored)


__all__ = ["Store", "StoreError", "reads", "writes"]
