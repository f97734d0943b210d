"""Read-only transactions (``store.read``: the service's GETs, key lookups and
stream polls) run on the store's read connection: they neither queue behind a write in
progress nor see it before it commits, and they see every write awaited before them."""

from __future__ import annotations

import asyncio
import threading

from agentledger.store import Store, open_store
from agentledger.store._base import NewRun
from agentledger.store._queries.runs import create_run
from agentledger.store._tx import Tx


def _names(tx: Tx) -> set[str]:
    return {r["name"] for r in tx.fetchall("SELECT name FROM runs")}


async def test_a_read_does_not_wait_for_a_write_in_progress(store: Store) -> None:
    inserted, release = threading.Event(), threading.Event()

    def slow_write(tx: Tx) -> None:
        create_run(tx, NewRun("workflow", "uncommitted", "1", {}))
        inserted.set()
        release.wait()  # holds the writer connection, its transaction open

    writing = asyncio.ensure_future(store.transact(slow_write))
    try:
        await asyncio.to_thread(inserted.wait)
        # Answered while the write holds the writer (on the writer's queue it would wait
        # for ever), and without the run that write has not committed.
        seen = await asyncio.wait_for(store.read(_names), 60)
        assert "uncommitted" not in seen
        assert not writing.done()
    finally:
        release.set()
        await writing
    assert "uncommitted" in await store.read(_names)


async def test_a_read_sees_every_write_awaited_before_it(store: Store) -> None:
    for i in range(50):
        await store.transact(lambda tx, i=i: create_run(tx, NewRun("workflow", f"r{i}", "1", {})))
        assert f"r{i}" in await store.read(_names)


async def test_extra_read_connections_close_when_idle(pg_url: str) -> None:
    """A burst of concurrent reads opens more read connections (up to the dialect's
    limit); once idle they close again, down to one, and reads go on."""
    store = open_store(pg_url)
    assert isinstance(store, Store)
    await store.open()
    store.reader_idle_seconds = 1.0
    try:

        def slow(tx: Tx) -> int:
            return len(tx.fetchall("SELECT pg_sleep(0.2)"))

        reads = []
        for _ in range(8):  # each arrives while the earlier ones are busy
            reads.append(asyncio.ensure_future(store.read(slow)))
            await asyncio.sleep(0.05)
        await asyncio.gather(*reads)
        assert 1 < len(store._readers) <= store.dialect.read_connections
        for _ in range(200):
            if len(store._readers) == 1:
                break
            await asyncio.sleep(0.05)
        assert len(store._readers) == 1
        assert await store.read(slow) == 1
    finally:
        await store.close()
