"""On PostgreSQL ``serve`` seals through a writer connection of its own: a seal never
queues behind accept groups, nor they behind it (docs/architecture.md, "The HTTP
service"). On SQLite it seals through the one store (one writer whatever the
connections)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import psycopg

from agentledger.service import create_app
from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from agentledger.store._tx import Tx
from tests.service import service_app
from tests.service.conftest import in_process, settings_for, until


async def _sealed(store: Any, run_id: str) -> bool:
    rows = await store.read(
        lambda tx: tx.fetchall("SELECT hash FROM events WHERE run_id = :r", {"r": run_id})
    )
    return bool(rows) and all(r["hash"] is not None for r in rows)


async def test_serve_seals_while_the_accepts_writer_is_busy(pg_url: str) -> None:
    async with in_process(settings_for(pg_url, audit_seal_every=0.05)) as api:
        store = api.store
        # Committed unsealed: a submission's events, written as a worker writes them
        # (not through an accept group).
        run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
        held, release = threading.Event(), threading.Event()

        def hold(tx: Tx) -> None:
            held.set()
            release.wait(30)  # the accepts' writer thread, busy in a transaction

        busy = asyncio.create_task(store.transact(hold))
        try:
            await asyncio.to_thread(held.wait, 10)
            await until(lambda: _sealed(store, run_id), timeout=15)
            assert not busy.done()  # sealed while the writer was still held
        finally:
            release.set()
            await busy
        checked, broken = await store.read(service_audit.verify_chain)
        assert broken == [] and checked >= 1


async def test_serve_on_sqlite_seals_what_others_wrote(tmp_path: Any) -> None:
    async with in_process(
        settings_for(f"sqlite:///{tmp_path / 's.db'}", audit_seal_every=0.05)
    ) as api:
        run_id = await service_app.app.submit(api.store, "echo", {"text": "x"}, tenant_id="t1")
        await until(lambda: _sealed(api.store, run_id), timeout=15)


async def test_serve_on_a_callers_store_seals_that_store(pg_url: str, tmp_path: Path) -> None:
    """The caller owns the store it passes in: the seal store is opened on that store's
    database, whatever ``settings.db_url`` says (here a SQLite file nobody uses)."""
    store = open_store(pg_url)
    await store.open()
    elsewhere = tmp_path / "elsewhere.db"
    try:
        settings = settings_for(f"sqlite:///{elsewhere}", audit_seal_every=0.05)
        api = create_app(settings, service_app.app, store=store)
        async with api.router.lifespan_context(api):
            run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
            await until(lambda: _sealed(store, run_id), timeout=10)
        assert not elsewhere.exists()
    finally:
        await store.close()


def _connections(url: str) -> dict[str, int]:
    """The database's connections by application name."""
    dbname = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, COUNT(*) FROM pg_stat_activity WHERE datname = %s "
            "GROUP BY application_name",
            (dbname,),
        ).fetchall()
    return {str(name): int(n) for name, n in rows}


async def test_the_seal_store_opens_no_journal_connection(pg_url: str) -> None:
    """The sealer writes no journal batches: its store holds a writer connection and a
    read connection, not the idle journal connection of an accepting store."""
    async with in_process(settings_for(pg_url, audit_seal_every=0.05)) as api:
        run_id = await service_app.app.submit(api.store, "echo", {"text": "x"}, tenant_id="t1")
        await until(lambda: _sealed(api.store, run_id), timeout=15)
        journal = {k: n for k, n in _connections(pg_url).items() if k.endswith(":journal")}
        assert sum(journal.values()) == 1, journal  # the accepting store's own
