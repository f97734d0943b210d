"""A PostgreSQL store whose open() fails after its writer connected (the database takes
one connection, the journal connection finds no room) leaves nothing behind: no thread,
no connection, and a later open() really opens."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from agentledger.errors import StoreUnavailable
from agentledger.store import open_store
from tests.pgcluster import PrivateCluster


def _store_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("agentledger-store")]


def _connections(admin_url: str, dbname: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_open_failing_after_the_writer_connected_leaks_nothing(
    pg_cluster: PrivateCluster,
) -> None:
    with psycopg.connect(pg_cluster.admin_url, autocommit=True) as conn:
        # A database limit binds roles that are not superusers; a fresh database has
        # no connection, so the store's writer is its first and its journal one too many.
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute("CREATE DATABASE partial OWNER app CONNECTION LIMIT 1")
    url = f"postgresql://app@127.0.0.1:{pg_cluster.port}/partial"
    store = open_store(url)
    with pytest.raises(StoreUnavailable, match="too many connections"):
        await store.open()
    assert _store_threads() == []
    deadline = time.monotonic() + 10
    while _connections(pg_cluster.admin_url, "partial") != 0:  # the writer's is closed
        assert time.monotonic() < deadline, "the writer's connection is still open"
        time.sleep(0.02)
    with psycopg.connect(pg_cluster.admin_url, autocommit=True) as conn:
        conn.execute("ALTER DATABASE partial CONNECTION LIMIT -1")
    await store.open()
    try:
        rows = await store.read(lambda tx: tx.fetchall("SELECT COUNT(*) AS n FROM runs"))
        assert rows[0]["n"] == 0
        assert _connections(pg_cluster.admin_url, "partial") >= 2  # writer and journal
    finally:
        await store.close()
