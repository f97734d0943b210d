"""Hostile values through a submit (one statement on PostgreSQL, two INSERTs on SQLite)
and through PostgreSQL's array parameters (one array text, ``Dialect.array``): nothing
a value holds changes the statement, splits or merges an element, or reaches another
row; concurrent submits of one request id make one run and one event."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from agentledger._canonical import clean_text
from agentledger.store import Store, open_store
from agentledger.store._tx import Tx
from tests.store.test_claim_statements import _events
from tests.store.test_contract import TARGET, new_run

HOSTILE = [
    'a"b',
    "a\\b",
    "a,b",
    "{a}",
    "{",
    "}",
    "",
    "NULL",
    "null",
    " x ",
    "\t",
    "\n",
    "é",
    "\U0001f600",
    "123",
    "-1",
    "1e3",
    "a\x00b",
    "\ud800",
    '\\"',
    '"',
    "'",
    "a\\",
    "\\",
    "a'); DROP TABLE runs; --",
    "{1,2}",
    '{"a","b"}',
    "[1:2]={a,b}",
    "x" * 10_000,
]


async def test_a_submit_keeps_hostile_values_and_its_event_is_seq_one(store: Store) -> None:
    for i, value in enumerate(HOSTILE):
        payload: dict[str, Any] = {"v": value, "big": ["y" * 1000] * 200, value: i}
        new = dataclasses.replace(
            new_run(), input=payload, user_id=value or None, request_id=f"{value}-{i}"
        )
        run = await store.create_run(new)
        assert run == await store.get_run(run.id)
        assert run.request_id == clean_text(f"{value}-{i}")
        assert await store.create_run(new) == run  # retried: the same run, no new event
        assert [e[:3] for e in await store.read(_events, run.id)] == [
            (1, "run.submitted", clean_text(value or "api"))
        ]
        assert [e.data for e in await store.list_events(run.id)] == [{"input": run.input}]
    claimed = await store.claim_runs("w1", [TARGET], len(HOSTILE), 30)
    assert len(claimed) == len(HOSTILE)
    for run in claimed:
        assert [e[0] for e in await store.read(_events, run.id)] == [1, 2]


async def test_concurrent_submits_of_one_request_make_one_run(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(4)]
    for s in stores:
        await s.open()
    try:
        for round_no in range(5):
            new = dataclasses.replace(new_run(), request_id=f"same-{round_no}")
            made = await asyncio.gather(*(s.create_run(new) for s in stores for _ in range(3)))
            assert len({r.id for r in made}) == 1, made
            events = await stores[0].read(_events, made[0].id)
            assert [e[:2] for e in events] == [(1, "run.submitted")]
        assert len(await stores[0].list_runs(limit=100)) == 5
    finally:
        for s in stores:
            await s.close()


def _round_trip(tx: Tx, values: list[Any], sql_type: str) -> list[Any]:
    found = tx.fetchall(
        f"SELECT x FROM unnest(CAST(:a AS {sql_type}[])) WITH ORDINALITY AS t(x, n) ORDER BY n",
        {"a": tx.dialect.array(values)},
    )
    return [row["x"] for row in found]


@pytest.mark.postgres
async def test_an_array_text_holds_each_element_as_it_is(pg_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    try:
        values: list[Any] = [*HOSTILE, None, *HOSTILE]
        want = [None if v is None else clean_text(v) for v in values]
        assert await store.read(_round_trip, values, "TEXT") == want
        assert await store.read(_round_trip, [], "TEXT") == []
        many = [f'"{i},' for i in range(20_000)]
        assert await store.read(_round_trip, many, "TEXT") == many
        ints = [0, -1, 2**63 - 1, -(2**63), None]
        assert await store.read(_round_trip, ints, "BIGINT") == ints
    finally:
        await store.close()


@pytest.mark.postgres
async def test_hostile_run_ids_renew_no_lease_and_ask_no_other_run(pg_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    try:
        theirs = await store.create_run(new_run())
        (held,) = await store.claim_runs("w-other", [TARGET], 1, 30)
        assert held.id == theirs.id
        await store.cancel_run(held.id, "stop", "ops")
        before = await store.get_run(held.id)
        hostile = {v: held.lease_epoch for v in HOSTILE}
        hostile.update({f'{held.id}"': held.lease_epoch, f"{held.id},x": held.lease_epoch})
        hostile[f"{{{held.id}}}"] = held.lease_epoch
        lost = await store.renew_leases("w-me", {**hostile, held.id: held.lease_epoch}, 60)
        assert lost == {*hostile, held.id}  # another worker's lease is not ours to renew
        after = await store.get_run(held.id)
        assert before is not None and after is not None
        assert after.lease_expires_at == before.lease_expires_at
        assert await store.cancel_requests(list(hostile)) == {}
        assert await store.cancel_requests([*hostile, held.id]) == {held.id: "stop"}
    finally:
        await store.close()
