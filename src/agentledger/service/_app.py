"""The app factory: ``create_app(settings, agent_app)`` -> a FastAPI ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI

# The inline workers' model steps check tenant budgets through the gateway's hooks
# (engine/_hooks.py): a priced call is refused in a process without it.
import agentledger.gateway as _gateway  # noqa: F401
from agentledger import _sealer as sealer
from agentledger._app import App
from agentledger._failures import FailureLog
from agentledger.service import _accepting as accepting
from agentledger.service import _console as console
from agentledger.service import _deltas as deltas
from agentledger.service import _docs_pages as docs_pages
from agentledger.service import _problems as problems
from agentledger.service._accepts import AcceptBatcher
from agentledger.service._auth import KeyCache, warn_of_other_peppers
from agentledger.service._egress import Egress
from agentledger.service._fastpath import ServiceAPI
from agentledger.service._hub import EventHub
from agentledger.service._idempotency import InFlight
from agentledger.service._queries import console as console_queries
from agentledger.service._routers import approvals, audit, events, health, observe, runs
from agentledger.service._settings import ServiceSettings
from agentledger.service._webhooks import Dispatcher
from agentledger.store import Store, open_store

log = logging.getLogger(__name__)


def create_app(settings: ServiceSettings, agent_app: App, store: Store | None = None) -> FastAPI:
    """The service over ``settings.db_url`` (or an already open ``store``, which the
    caller then owns), serving the agents and workflows ``agent_app`` declares."""
    # Webhook targets: checked at submit (routers/runs.py) and at delivery (webhooks.py).
    # Built first: a malformed allow-list stops `serve` in one line, before any warning.
    egress = Egress.from_env(settings.webhook_allow_hosts, settings.webhook_hosts)
    sealer.key_at_start()  # an unusable AGENTLEDGER_AUDIT_KEY stops `serve` before it listens
    own_store = store is None
    the_store: Store = store if store is not None else open_store(settings.db_url)

    @contextlib.asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        if own_store:
            await the_store.open()
        try:
            seal_store = await _open_seal_store(the_store)
        except BaseException:
            if own_store:
                await the_store.close()
            raise
        await warn_of_other_peppers(the_store, settings.pepper)
        hub = EventHub(the_store, settings.event_poll)
        hub.start()
        api.state.hub = hub
        unhooks = _wake_hub_on_commits(the_store, hub)
        accepts = AcceptBatcher(the_store)
        accepts.start()
        api.state.accepts = accepts
        api.state.inline_failure = None
        workers = await _start_workers(
            the_store, agent_app, settings.workers_inline, lambda why: _inline_failed(api, why)
        )
        # /metrics without a key, on a port of its own (observe/_metrics.py, as the worker's).
        metrics = None
        if settings.metrics_port is not None:  # prometheus-client: the metrics extra
            from agentledger.observe._metrics import start_metrics

            metrics = start_metrics(the_store, settings.metrics_port, settings.metrics_host)
        dispatcher = Dispatcher(
            the_store, period=settings.webhook_poll, backoff=settings.webhook_backoff,
            egress=api.state.egress,
        )  # fmt: skip
        failures = FailureLog(log)  # the store's failures, each cause logged once
        background = [
            asyncio.create_task(
                sealer.seal_forever(
                    seal_store, settings.audit_seal_every, failures, _SEAL_SLICE, _SEAL_SLICES
                )
            ),
            asyncio.create_task(
                _purge_keys_forever(seal_store, settings.audit_seal_every, failures)
            ),
            asyncio.create_task(dispatcher.run_forever()),
        ]
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if seal_store is not the_store:
                await seal_store.close()
            if metrics is not None:
                metrics.stop()
            await _stop_workers(workers)
            await accepts.stop()
            for unhook in unhooks:
                await asyncio.to_thread(unhook)  # a listener's stop joins its thread
            await hub.stop()
            await deltas.close_bridges()
            if own_store:
                await the_store.close()

    # ServiceAPI: FastAPI with plain submits answered in front of its middleware stack
    # (service/_fastpath.py).
    api = ServiceAPI(
        title="agentledger",
        version="1",
        summary="Durable runs of AI agents: submit, watch, approve, audit.",
        lifespan=lifespan,
        # Served by service/_docs_pages.py with the assets from the package, not a CDN.
        docs_url=None,
        redoc_url=None,
    )
    api.state.settings = settings
    api.state.store = the_store
    api.state.agent_app = agent_app
    api.state.keys = KeyCache(settings.key_cache_seconds)
    api.state.in_flight = InFlight()
    api.state.egress = egress
    problems.install(api)  # error documents, request ids, the body limit

    for module in (health, runs, events, approvals, audit, observe):
        api.include_router(module.router)
    docs_pages.install(api)
    console.install(api)  # the web console at /ui
    return api


def _wake_hub_on_commits(store: Store, hub: EventHub) -> list[Callable[[], None]]:
    """Poke the hub after journal commits: this process's (inline workers) directly, any
    process's through the database's notifications where it has them (PostgreSQL).
    Returns the functions that undo it."""
    undo: list[Callable[[], None]] = [store.on_journal_commit(hub.poke)]
    stop = store.listen_events(hub.poke_threadsafe)
    if stop is not None:
        undo.append(stop)
    return undo


async def _open_seal_store(store: Store) -> Store:
    """The store ``serve``'s sealer writes through: on a database server, a store (and
    so a writer connection) of its own on ``store``'s database, opened here; on SQLite,
    ``store``. Its URL is ``store``'s, not the settings': a caller's store may be on
    another database than ``settings.db_url`` names. It writes no journal batches, so
    it opens no journal connection: a writer and a read connection.

    On PostgreSQL, sealing on the accepts' one writer connection would queue every accept
    group behind a seal transaction (each accepted run has two events to chain), holding
    ``serve`` below the rate it accepts at otherwise (docs/benchmarks.md). On its own
    connection the seal runs beside the groups (sealers of one tenant are serialized by
    its head row's lock, as across processes). SQLite has one writer whatever the
    connections."""
    if store.dialect.one_writer:
        return store
    own = open_store(store.url)
    await own.open(loop_committer=False)
    return own


# Records per seal transaction here: on SQLite the accept groups share the database's one
# writer with the sealer, and a group queued behind a seal transaction waits for all of
# it, a whole default batch costing about the accepts' p99 (docs/benchmarks.md). Small
# slices interleave with the groups; as many slices per round as the default sealer's
# batches.
_SEAL_SLICE = 100
_SEAL_SLICES = sealer.BATCH * sealer.MAX_BATCHES // _SEAL_SLICE


async def _purge_keys_forever(store: Store, period: float, failures: FailureLog) -> None:
    """Remove expired idempotency keys and console sessions every ``period`` seconds
    (beside the sealer)."""
    while True:
        await asyncio.sleep(period)
        try:
            await store.transact(accepting.purge_idempotency_keys, time.time())
            await store.transact(console_queries.purge_sessions, time.time())
        except Exception as exc:  # retried next period
            failures.failed("idempotency key purge", exc)
        else:
            failures.recovered("idempotency key purge")


def _inline_failed(api: FastAPI, why: str) -> None:
    """An inline worker stopped on an error: runs accepted from now on would wait for a
    worker that is gone, so say it loudly and answer /readyz with 503 (a process manager
    or a load balancer takes this process out; /healthz still answers)."""
    log.error("an inline worker stopped: %s; this process no longer executes runs", why)
    if api.state.inline_failure is None:
        api.state.inline_failure = why


async def _start_workers(
    store: Store, app: App, n: int, failed: Callable[[str], None]
) -> list[tuple[Any, asyncio.Task[None]]]:
    if n <= 0:
        return []
    from agentledger.observe import _stuck as stuck
    from agentledger.worker._config import WorkerConfig
    from agentledger.worker._worker import Worker

    started = []
    for _ in range(n):
        # This process's own dispatcher delivers the webhooks (see lifespan above).
        worker = Worker(store, app, WorkerConfig(webhooks=False), companions=[stuck.companion()])
        task = asyncio.create_task(worker.run(install_signals=False), name="inline-worker")
        task.add_done_callback(lambda t: _report_failure(t, failed))
        started.append((worker, task))
    return started


def _report_failure(task: asyncio.Task[None], failed: Callable[[str], None]) -> None:
    """Call ``failed`` with the cause when an inline worker's task ended on an error (a
    worker asked to stop returns normally)."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        failed(f"{type(exc).__name__}: {exc}")


async def _stop_workers(workers: list[tuple[Any, asyncio.Task[None]]]) -> None:
    for worker, _ in workers:
        worker.stop()
    for worker, task in workers:
        # Bounded: a worker that outlives its grace (and the release after it) by this
        # much is stuck on something that will not come; `serve` still stops, and says so.
        bound = worker.config.shutdown_grace + _STOP_MARGIN
        done, _ = await asyncio.wait({task}, timeout=bound)
        if not done:
            log.error(
                "an inline worker did not stop within %.0f s of being asked; cancelled "
                "(its runs are released when their leases expire)",
                bound,
            )
            task.cancel()
            continue
        with contextlib.suppress(Exception):
            await task


# Seconds past an inline worker's shutdown grace before `serve` stops waiting for it.
_STOP_MARGIN = 30.0
