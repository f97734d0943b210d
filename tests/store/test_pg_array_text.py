"""An array parameter sent as one text (``Dialect.array``) reads back as the values it
was made of, element for element: the seal's links, a heartbeat's leases and every
``among`` condition pass their values this way on PostgreSQL."""

from __future__ import annotations

import pytest

from agentledger.store import open_store
from agentledger.store._tx import Tx

pytestmark = pytest.mark.postgres

TEXTS = [
    "plain", 'a "quoted" one', "back\\slash", "trailing\\", "a,comma", "{braces}", " padded ",
    "NULL", "null", "", "é ünïcödé ✓", "sig:k1:0a9f", "new\nline", "tab\there", "'single'",
]  # fmt: skip


def _texts(tx: Tx, values: list[str | None]) -> list[str | None]:
    found = tx.fetchall(
        "SELECT v FROM unnest(CAST(:a AS TEXT[])) WITH ORDINALITY AS t(v, n) ORDER BY n",
        {"a": tx.dialect.array(values)},
    )
    return [r["v"] for r in found]


def _numbers(tx: Tx, values: list[int | None]) -> list[int | None]:
    found = tx.fetchall(
        "SELECT v FROM unnest(CAST(:a AS BIGINT[])) WITH ORDINALITY AS t(v, n) ORDER BY n",
        {"a": tx.dialect.array(values)},
    )
    return [r["v"] for r in found]


async def test_array_text_reads_back_element_for_element(pg_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    try:
        texts: list[str | None] = [*TEXTS, None, *TEXTS]
        assert await store.read(_texts, texts) == texts
        numbers: list[int | None] = [0, 1, -1, 2**63 - 1, -(2**63), None, 42]
        assert await store.read(_numbers, numbers) == numbers
        assert await store.read(_texts, []) == []
    finally:
        await store.close()
