"""Fixtures for the store suite (see tests/conftest.py for ``store_url`` and ``store``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentledger.store import Store, open_store
from agentledger.store._postgres import connect
from tests import dbutil
from tests.store.pgproxy import LossyProxy


@pytest.fixture
def empty_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL to an EMPTY database on each backend (no schema yet)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    request.getfixturevalue("_pg_session")
    url = dbutil.make_pg_database(migrated=False)
    try:
        yield url
    finally:
        dbutil.drop_pg_database(url)


@pytest.fixture
async def proxied_store(proxy: LossyProxy) -> AsyncIterator[Store]:
    """A store that talks to PostgreSQL through ``proxy``."""
    opened = open_store(proxy.url)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def holder(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A second connection, as a concurrent claimer whose transaction is still open
    (see :func:`hold`); rolled back and closed at the end."""
    conn = connect(pg_url)
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


@pytest.fixture
def conns(pg_url: str) -> Iterator[list[psycopg.Connection[Any]]]:
    """Connections a test opens on ``pg_url`` (claimers, holders): each rolled back and
    closed at the end."""
    opened: list[psycopg.Connection[Any]] = []
    try:
        yield opened
    finally:
        for c in opened:
            c.rollback()
            c.close()


def hold(conn: psycopg.Connection[Any], ids: list[str]) -> None:
    """Lock these runs FOR UPDATE on ``conn`` and keep its transaction open.

    Held until the test lets go, however long a loaded machine makes the claims in
    between: the store's idle-in-transaction timeout (``conn`` is a store session) would
    end the hold halfway, and the held rows would be claimed."""
    conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
    locked = conn.execute("SELECT id FROM runs WHERE id = ANY(%s) FOR UPDATE", (ids,)).fetchall()
    assert len(locked) == len(ids)
