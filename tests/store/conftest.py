"""Fixtures for the store suite (see tests/conftest.py for ``store_url`` and ``store``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentledger.store import SQLStore, open_store
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
async def proxied_store(proxy: LossyProxy) -> AsyncIterator[SQLStore]:
    """A store that talks to PostgreSQL through ``proxy``."""
    opened = open_store(proxy.url)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()
