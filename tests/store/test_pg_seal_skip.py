"""A sealer finding a tenant's chain head held by another sealer skips the tenant at
once (PostgreSQL), also after the holder has moved the head -- it does not wait, with a
connection (in ``serve``, perhaps the one its accepts share), for the holder to commit."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest

from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from tests.service import service_app

pytestmark = pytest.mark.postgres


async def test_a_sealer_skips_a_head_another_sealer_has_moved(pg_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    holder = psycopg.connect(pg_url)
    released = threading.Event()

    def let_go() -> None:  # only if the sealer waited for the holder: never otherwise
        holder.rollback()
        released.set()

    release = threading.Timer(20.0, let_go)
    try:
        await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
        await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t2")
        assert await store.transact(service_audit.seal) > 0
        await service_app.app.submit(store, "echo", {"text": "y"}, tenant_id="t1")
        await service_app.app.submit(store, "echo", {"text": "y"}, tenant_id="t2")
        # Another sealer, in its transaction: t1's head locked and moved, not committed.
        holder.execute("SELECT * FROM audit_heads WHERE tenant_id = 't1' FOR UPDATE")
        holder.execute("UPDATE audit_heads SET chain_no = chain_no WHERE tenant_id = 't1'")
        release.start()
        sealed = await asyncio.wait_for(store.transact(service_audit.seal), timeout=120)
        # Done while the holder still held t1's head (not in a time: a loaded machine
        # made the seal last past the 3 s it was given).
        assert not released.is_set(), "the sealer waited for the head's holder"
        assert sealed == 1  # t2's event; t1 is left to its holder
        holder.rollback()
        assert await store.transact(service_audit.seal) == 1  # t1's
        checked, broken = await store.read(service_audit.verify_chain)
        assert broken == [] and checked == 4
    finally:
        release.cancel()
        holder.close()
        await store.close()
