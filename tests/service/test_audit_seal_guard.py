"""Sealing writes a tenant's new chain links set-based (one UPDATE per 500 records), each
only if its record is still unsealed: when any was chained meanwhile, the whole seal is
rolled back (a gap in the chain would follow), and the next seal starts from the head."""

from __future__ import annotations

from typing import Any

import pytest

from agentledger.errors import StoreError
from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from agentledger.store._tx import Tx
from tests.service import service_app


async def test_a_record_chained_meanwhile_rolls_the_seal_back(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
        await store.append_event(run_id, "note", "test", {"n": 1})
        unsealed = await store.transact(
            lambda tx: tx.fetchall("SELECT id FROM events WHERE hash IS NULL ORDER BY id")
        )
        assert len(unsealed) >= 2
        last = unsealed[-1]["id"]
        real = service_audit.record_hash
        calls = {"n": 0}

        def hash_and_interfere(prev: str, tenant: str, row: dict[str, Any], n: int) -> str:
            calls["n"] += 1
            if calls["n"] == 1:  # another writer chains the last record meanwhile
                conn = interfering["conn"]
                store.dialect.execute(
                    conn, "UPDATE events SET hash = 'x' WHERE id = :id", {"id": last}
                )
            return real(prev, tenant, row, n)

        interfering: dict[str, Any] = {}
        monkeypatch.setattr(service_audit, "record_hash", hash_and_interfere)

        def seal(tx: Tx) -> int:
            interfering["conn"] = tx.conn
            return service_audit.seal(tx)

        with pytest.raises(StoreError, match="sealed concurrently"):
            await store.transact(seal)
        monkeypatch.setattr(service_audit, "record_hash", real)
        # Rolled back as a whole: nothing chained, the head did not move.
        rows = await store.transact(
            lambda tx: tx.fetchall("SELECT COUNT(*) AS n FROM events WHERE hash IS NOT NULL")
        )
        assert rows[0]["n"] == 0
        assert await store.transact(service_audit.seal) == len(unsealed)
        checked, broken = await store.read(service_audit.verify_chain)
        assert broken == [] and checked == len(unsealed)
    finally:
        await store.close()


async def test_links_written_in_several_updates_chain_in_order(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_audit, "_LINKS_PER_UPDATE", 7)
    store = open_store(store_url)
    await store.open()
    try:
        run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
        for n in range(20):
            await store.append_event(run_id, "note", "test", {"n": n})
        assert await store.transact(service_audit.seal) == 21
        checked, broken = await store.read(service_audit.verify_chain)
        assert broken == [] and checked == 21
        numbers = await store.transact(
            lambda tx: tx.fetchall("SELECT chain_no FROM events ORDER BY id")
        )
        assert [r["chain_no"] for r in numbers] == list(range(1, 22))
    finally:
        await store.close()
