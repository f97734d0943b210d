"""A :class:`Store` over any SQL dialect, with group commit (see groupcommit.py).

Claims, heartbeats, reads and the other non-journal work go through one writer
thread that owns one connection, each job in its own transaction. The read-only
transactions of :meth:`SQLStore.transact` (``write=False``: the HTTP service's GETs, key
lookups, event-stream polls) go through read threads with a connection each -- one to
start with, more (up to the dialect's ``read_connections``) while every one is busy,
the extra ones closed again after :data:`READER_IDLE_SECONDS` without work --
so writes never queue behind them nor they behind writes (SQLite in WAL mode reads while
another connection writes; PostgreSQL reads what is committed). Every write a caller
awaited committed before its next read begins, so that read sees it. Journal batches
go through the store's :class:`~agentledger.store.groupcommit.JournalCommitter`
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
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from agentledger.auditkey import AuditKey
from agentledger.clock import Clock
from agentledger.errors import AgentLedgerError, StoreError, StoreUnavailable, UsageError
from agentledger.records import Approval, Effect, Event, OutboxItem, Run, Step, WorkerInfo
from agentledger.store import queries as q
from agentledger.store.base import Batch, NewRun, Store
from agentledger.store.dialect import Dialect
from agentledger.store.groupcommit import (
    NOT_DONE,
    Job,
    JournalCommitter,
    ThreadReply,
    run_group,
    run_single,
)
from agentledger.store.queries import restore
from agentledger.store.retrying import Reconnect

if TYPE_CHECKING:
    from agentledger.memory.queries import Fact
    from agentledger.observe.queries.resume import ResumePlan
    from agentledger.observe.queries.stuck import StuckRun
    from agentledger.retrieval.queries import ChunkHit, Document, NewChunk

log = logging.getLogger(__name__)
T = TypeVar("T")

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


class _WriterThreadCommitter:
    """Journal batches through the store's writer thread, grouped with the others
    queued there; takes every batch (the last committer asked)."""

    def __init__(self, store: SQLStore) -> None:
        self._store = store

    def accepts(self, batch: Batch) -> bool:
        return True

    async def commit(self, batch: Batch) -> None:
        store = self._store
        await store._call(
            lambda c: q.apply_batch(store.dialect, c, batch), grouped=True, batch=batch
        )

    async def close(self) -> None:
        """Nothing to release: the store stops its thread after the committers."""


class SQLStore(Store):
    """The shared SQL store; a backend supplies a :class:`Dialect`."""

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
        return await self._call(lambda c: q.migrate(self.dialect, c), write=False)

    # the writer thread ----------------------------------------------------

    def _serve(self, started: concurrent.futures.Future[None]) -> None:
        try:
            self._conn = self.dialect.connect()
            if getattr(self, "_migrate", True):
                self.applied = q.migrate(self.dialect, self._conn)
            elif not q.is_current(self.dialect, self._conn):
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
                    run_single(self.dialect, conn, job, self._error)
                except Exception as exc:
                    transient = self.dialect.is_transient(exc) and retry.may_retry_transient()
                    lost = self.dialect.is_disconnect(exc) and retry.within_window()
                    if not transient:  # lost, or failing to open: a new one next time
                        with contextlib.suppress(Exception):
                            if conn is not None:
                                self.dialect.close(conn)
                        conn = None
                    if not (transient or lost):
                        job.future.set_exception(self._error(exc))
                        break
                    log.warning("store read failed (%s); retrying", exc)
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
                    log.info("store transaction rolled back (%s); retrying", exc)
                    time.sleep(retry.transient_pause())
                    continue
                log.warning("store connection lost (%s); reconnecting", exc)
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
        run_single(self.dialect, self._conn, job, self._error)

    def _run_group(self, jobs: list[Job]) -> None:
        run_group(self.dialect, self._conn, jobs, self.group_sizes, self._error)

    def _error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, AgentLedgerError):
            return exc
        return self.dialect.translate(exc)

    async def _call(
        self,
        fn: Callable[[Any], T],
        *,
        write: bool = True,
        grouped: bool = False,
        batch: Batch | None = None,
        recover: Callable[[Any], Any] | None = None,
    ) -> T:
        if self._thread is None:
            raise StoreUnavailable("the store is not open; call `await store.open()` first")
        reply = ThreadReply(asyncio.get_running_loop())
        job = Job(fn, reply, write, grouped, batch, recover)
        job.retried = batch is not None and batch.resent  # Batch.resent: look first
        self._queue.put(job)
        result: T = await reply.future
        return result

    # runs ------------------------------------------------------------------

    async def create_run(self, new: NewRun) -> Run:
        if new.request_id is None:  # fixed before the first attempt, so a retry finds it
            new = dataclasses.replace(new, request_id=q.new_id("q"))
        return await self._call(lambda c: q.create_run(self.dialect, c, new))

    async def get_run(self, run_id: str) -> Run | None:
        return await self._call(lambda c: q.get_run(self.dialect, c, run_id), write=False)

    async def list_runs(
        self, status: str | None = None, name: str | None = None, limit: int = 100
    ) -> list[Run]:
        return await self._call(
            lambda c: q.list_runs(self.dialect, c, status, name, limit), write=False
        )

    async def count_runs(self) -> dict[str, int]:
        return await self._call(lambda c: q.count_runs(self.dialect, c), write=False)

    async def claim_runs(
        self, owner: str, targets: list[str], limit: int, lease_seconds: float
    ) -> list[Run]:
        token = q.new_token()

        def recover(c: Any) -> Any:
            found = q.claimed_with(self.dialect, c, owner, token)
            return NOT_DONE if found is None else found

        return await self._call(
            lambda c: q.claim_runs(self.dialect, c, owner, targets, limit, lease_seconds, token),
            recover=recover,
        )

    async def renew_leases(
        self, owner: str, leases: dict[str, int], lease_seconds: float
    ) -> set[str]:
        return await self._call(
            lambda c: q.renew_leases(self.dialect, c, owner, leases, lease_seconds)
        )

    async def release_run(self, run_id: str, epoch: int, owner: str) -> bool:
        token = q.new_token()

        def recover(c: Any) -> Any:  # released before the reply was lost: say so
            return True if q.has_event(self.dialect, c, run_id, token) else NOT_DONE

        return await self._call(
            lambda c: q.release_run(self.dialect, c, run_id, epoch, owner, token),
            recover=recover,
        )

    async def expire_leases_of(self, owners: list[str]) -> int:
        return await self._call(lambda c: q.expire_leases_of(self.dialect, c, owners))

    async def lease_owners(self) -> list[str]:
        return await self._call(lambda c: q.lease_owners(self.dialect, c), write=False)

    async def cancel_run(self, run_id: str, reason: str, actor: str) -> Run:
        return await self._call(lambda c: q.cancel_run(self.dialect, c, run_id, reason, actor))

    async def cancel_requests(self, run_ids: list[str]) -> dict[str, str]:
        return await self._call(
            lambda c: q.cancel_requests(self.dialect, c, list(run_ids)), write=False
        )

    # journal ---------------------------------------------------------------

    async def load_journal(self, run_id: str) -> list[Step]:
        return await self._call(lambda c: q.load_journal(self.dialect, c, run_id), write=False)

    async def commit(self, batch: Batch) -> None:
        q.validate_batch(batch)  # a batch no database can store fails here, alone
        for committer in self._committers:
            if committer.accepts(batch):
                await committer.commit(batch)
                for hook in self._journal_hooks:  # committed: durable, now others may look
                    hook()
                return
        raise StoreUnavailable("the store is not open; call `await store.open()` first")

    # tenant budgets of model calls --------------------------------------------

    async def set_tenant_budget(
        self,
        tenant_id: str,
        period_seconds: float,
        max_spend_usd: float | None = None,
        max_tokens: int | None = None,
        max_rps: float | None = None,
    ) -> None:
        from agentledger.gateway import queries as gateway_budgets

        await self._call(
            lambda c: gateway_budgets.set_tenant_budget(
                self.dialect, c, tenant_id, period_seconds, max_spend_usd, max_tokens, max_rps
            )
        )

    async def reserve_tenant_usage(
        self, tenant_id: str, now: float, usd: float, tokens: int
    ) -> dict[str, Any] | None:
        from agentledger.gateway import queries as gateway_budgets

        return await self._call(
            lambda c: gateway_budgets.reserve_tenant_usage(
                self.dialect, c, tenant_id, now, usd, tokens
            )
        )

    async def settle_tenant_usage(
        self, tenant_id: str, period_start: float, usd: float, tokens: int
    ) -> None:
        from agentledger.gateway import queries as gateway_budgets

        await self._call(
            lambda c: gateway_budgets.settle_tenant_usage(
                self.dialect, c, tenant_id, period_start, usd, tokens
            )
        )

    # effects, events, approvals, outbox -------------------------------------

    async def get_effect(self, key: str) -> Effect | None:
        return await self._call(lambda c: q.get_effect(self.dialect, c, key), write=False)

    async def swap_effect(self, effect: Effect, expected: str | None) -> tuple[bool, Effect | None]:
        from agentledger.store.queries.effect_swap import swap_effect

        return await self._call(lambda c: swap_effect(self.dialect, c, effect, expected))

    async def list_events(self, run_id: str | None = None, after_id: int = 0) -> list[Event]:
        return await self._call(
            lambda c: q.list_events(self.dialect, c, run_id, after_id), write=False
        )

    async def append_event(self, run_id: str, type: str, actor: str, data: Any) -> None:
        token = q.new_token()

        def recover(c: Any) -> Any:  # appended before the reply was lost: not again
            return None if q.has_event(self.dialect, c, run_id, token) else NOT_DONE

        await self._call(
            lambda c: q.insert_event(self.dialect, c, run_id, type, actor, data, token=token),
            recover=recover,
        )

    async def get_approvals(
        self, run_id: str | None = None, pending: bool = False
    ) -> list[Approval]:
        return await self._call(
            lambda c: q.get_approvals(self.dialect, c, run_id, pending), write=False
        )

    async def decide_approval(
        self, approval_id: str, decision: str, decided_by: str, clock: Clock | None = None
    ) -> Approval:
        return await self._call(
            lambda c: q.decide_approval(self.dialect, c, approval_id, decision, decided_by, clock)
        )

    async def claim_outbox(self, owner: str, limit: int, lease_seconds: float) -> list[OutboxItem]:
        token = q.new_token()

        def recover(c: Any) -> Any:  # leased before the reply was lost: those rows
            found = q.claimed_outbox(self.dialect, c, owner, token)
            return NOT_DONE if found is None else found

        return await self._call(
            lambda c: q.claim_outbox(self.dialect, c, owner, limit, lease_seconds, token),
            recover=recover,
        )

    async def settle_outbox(self, item: OutboxItem) -> bool:
        return await self._call(lambda c: q.settle_outbox(self.dialect, c, item))

    async def list_outbox(
        self, status: str | None = None, run_id: str | None = None
    ) -> list[OutboxItem]:
        return await self._call(
            lambda c: q.list_outbox(self.dialect, c, status, run_id), write=False
        )

    # workers -----------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo, kinds: dict[str, str]) -> None:
        await self._call(lambda c: q.register_worker(self.dialect, c, info, kinds))

    async def heartbeat_worker(self, worker_id: str) -> None:
        await self._call(lambda c: q.heartbeat_worker(self.dialect, c, worker_id))

    async def deregister_worker(self, worker_id: str) -> None:
        await self._call(lambda c: q.deregister_worker(self.dialect, c, worker_id))

    async def list_workers(self, live_within: float | None = None) -> list[WorkerInfo]:
        return await self._call(lambda c: q.list_workers(self.dialect, c, live_within), write=False)

    async def registrations(self) -> list[dict[str, Any]]:
        return await self._call(lambda c: q.registrations(self.dialect, c), write=False)

    async def version_counts(self) -> list[dict[str, Any]]:
        return await self._call(lambda c: q.version_counts(self.dialect, c), write=False)

    async def open_runs(self, targets: list[str]) -> int:
        return await self._call(lambda c: q.open_runs(self.dialect, c, targets), write=False)

    async def mark_restored(self, source: str, actor: str) -> int:
        return await self._call(lambda c: restore.mark_restored(self.dialect, c, source, actor))

    # memory and retrieval ----------------------------------------------------

    async def remember_fact(
        self,
        tenant_id: str,
        user_id: str,
        fact_key: str,
        fact: str,
        source_run: str | None = None,
        source_key: str | None = None,
    ) -> Fact:
        from agentledger.memory import queries as memory_facts

        return await self._call(
            lambda c: memory_facts.upsert_fact(
                self.dialect, c, tenant_id, user_id, fact_key, fact, source_run, source_key
            )
        )

    async def list_facts(
        self, tenant_id: str | None, user_id: str, created_before: float | None = None
    ) -> list[Fact]:
        from agentledger.memory import queries as memory_facts

        if tenant_id is None:
            return await self._call(
                lambda c: memory_facts.all_facts(self.dialect, c, None, user_id), write=False
            )
        return await self._call(
            lambda c: memory_facts.list_facts(
                self.dialect, c, tenant_id, user_id, created_before=created_before
            ),
            write=False,
        )

    async def fact_by_source(self, tenant_id: str, user_id: str, source_key: str) -> Fact | None:
        from agentledger.memory import queries as memory_facts

        return await self._call(
            lambda c: memory_facts.fact_by_source(self.dialect, c, tenant_id, user_id, source_key),
            write=False,
        )

    async def forget_facts(
        self,
        tenant_id: str,
        user_id: str,
        fact_key: str | None,
        actor: str,
        audit_key: AuditKey | None = None,
    ) -> int:
        from agentledger.memory import queries as memory_facts

        return await self._call(
            lambda c: memory_facts.forget_facts(
                self.dialect, c, tenant_id, user_id, fact_key, actor, audit_key
            )
        )

    async def add_document(
        self,
        tenant_id: str,
        source: str,
        title: str,
        kind: str,
        sha256: str,
        chunks: list[NewChunk],
        actor: str,
    ) -> tuple[Document, bool]:
        from agentledger.retrieval import queries as retrieval_docs

        return await self._call(
            lambda c: retrieval_docs.add_document(
                self.dialect, c, tenant_id, source, title, kind, sha256, chunks, actor
            )
        )

    async def list_documents(self, tenant_id: str | None = None) -> list[Document]:
        from agentledger.retrieval import queries as retrieval_docs

        return await self._call(
            lambda c: retrieval_docs.list_documents(self.dialect, c, tenant_id), write=False
        )

    async def remove_document(self, tenant_id: str, ref: str, actor: str) -> int:
        from agentledger.retrieval import queries as retrieval_docs

        return await self._call(
            lambda c: retrieval_docs.remove_document(self.dialect, c, tenant_id, ref, actor)
        )

    async def search_chunks(self, tenant_id: str, query: str, k: int = 5) -> list[ChunkHit]:
        from agentledger.retrieval import queries as retrieval_docs

        return await self._call(
            lambda c: retrieval_docs.search_chunks(self.dialect, c, tenant_id, query, k),
            write=False,
        )

    # observability -------------------------------------------------------------

    async def observe_snapshot(self, *, live: bool = True, settled: bool = True) -> dict[str, Any]:
        from agentledger.observe.queries import metrics as observe_metrics

        return await self._call(
            lambda c: observe_metrics.snapshot(self.dialect, c, live=live, settled=settled),
            write=False,
        )

    async def run_stats(
        self, since: float | None, agent: str | None, tenant: str | None = None
    ) -> dict[str, Any]:
        from agentledger.observe.queries import stats as observe_stats

        return await self._call(
            lambda c: observe_stats.run_stats(self.dialect, c, since, agent, tenant), write=False
        )

    async def find_stuck(
        self, default_after: float, per_agent: dict[str, float], takeovers: int, live_within: float
    ) -> list[StuckRun]:
        from agentledger.observe.queries import stuck as observe_stuck

        return await self._call(
            lambda c: observe_stuck.find_stuck(
                self.dialect, c, default_after, per_agent, takeovers, live_within
            ),
            write=False,
        )

    async def mark_stuck(self, run: StuckRun, actor: str) -> bool:
        from agentledger.observe.queries import stuck as observe_stuck

        return await self._call(lambda c: observe_stuck.mark_stuck(self.dialect, c, run, actor))

    async def plan_resume(self, run_id: str, from_step: int | None) -> ResumePlan:
        from agentledger.observe.queries import resume as observe_resume

        return await self._call(
            lambda c: observe_resume.plan_resume(self.dialect, c, run_id, from_step), write=False
        )

    async def resume_run(
        self,
        run_id: str,
        from_step: int | None,
        actor: str,
        reason: str | None = None,
    ) -> ResumePlan:
        from agentledger.observe.queries import resume as observe_resume

        return await self._call(
            lambda c: observe_resume.resume_run(self.dialect, c, run_id, from_step, actor, reason)
        )

    async def settle_step(
        self,
        run_id: str,
        step_no: int,
        applied: bool,
        result: Any,
        actor: str,
        reason: str,
    ) -> Step:
        from agentledger.observe.queries import resume as observe_resume

        return await self._call(
            lambda c: observe_resume.settle_step(
                self.dialect, c, run_id, step_no, applied, result, actor, reason
            )
        )

    async def resume_candidates(self, status: str, agent: str | None, limit: int) -> list[str]:
        from agentledger.observe.queries import resume as observe_resume

        return await self._call(
            lambda c: observe_resume.candidates(self.dialect, c, status, agent, limit),
            write=False,
        )

    async def retry_outbox(self, key: str, actor: str) -> bool:
        from agentledger.observe.queries import resume as observe_resume

        return await self._call(lambda c: observe_resume.retry_outbox(self.dialect, c, key, actor))

    async def trace_context(self, run_id: str) -> str | None:
        from agentledger.observe.queries import trace as observe_trace

        return await self._call(
            lambda c: observe_trace.get_trace_context(self.dialect, c, run_id), write=False
        )

    async def claim_trace_context(self, run_id: str, context: str) -> str | None:
        from agentledger.observe.queries import trace as observe_trace

        return await self._call(
            lambda c: observe_trace.claim_trace_context(self.dialect, c, run_id, context)
        )

    async def transact(self, fn: Callable[[Dialect, Any], T], *, write: bool = True) -> T:
        if write or not self._readers:
            return await self._call(lambda c: fn(self.dialect, c), write=write)
        # Read-only: on the read connection (see the module doc).
        reply = ThreadReply(asyncio.get_running_loop())
        self._reads.put(Job(lambda c: fn(self.dialect, c), reply, False, False))
        if not self._idle_readers and len(self._readers) < self.dialect.read_connections:
            self._add_reader()  # every read connection busy: one more
        result: T = await reply.future
        return result


__all__ = ["SQLStore", "StoreError"]
