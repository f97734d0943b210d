"""A claim is a fixed number of statements whatever it takes: the claim statement takes
each run's next event seq under its row lock, and the runs' ``run.claimed`` events are
one INSERT (on PostgreSQL every statement inside the claiming transaction is a round
trip while it holds the claimed rows). The events stay exact: per run, gapless seqs in
commit order, the claim's epoch in each, so a stream resumed by ``Last-Event-ID``
misses and repeats nothing."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import pytest

from agentledger.store import Store
from agentledger.store._queries import runs
from agentledger.store._tx import Tx
from tests.store.test_contract import TARGET, batch, new_run, step

RUNS = 12


def _events(tx: Tx, run_id: str) -> list[tuple[int, str, str, str]]:
    """(seq, type, actor, data) of a run's events in the order they were written."""
    found = tx.fetchall(
        "SELECT seq, type, actor, data FROM events WHERE run_id = :r ORDER BY id", {"r": run_id}
    )
    return [(int(e["seq"]), e["type"], e["actor"], e["data"]) for e in found]


def _spy(store: Store, monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()
    cls = type(store.dialect)
    execute, fetchall = cls.execute, cls.fetchall

    def counted(real: Any) -> Any:
        def call(self: Any, conn: Any, sql: str, params: Any = None) -> Any:
            seen[" ".join(sql.split()[:3])] += 1
            return real(self, conn, sql, params)

        return call

    monkeypatch.setattr(cls, "execute", counted(execute))
    monkeypatch.setattr(cls, "fetchall", counted(fetchall))
    return seen


async def test_a_claim_is_two_statements_whatever_it_takes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [(await store.create_run(new_run())).id for _ in range(RUNS)]
    seen = _spy(store, monkeypatch)
    claimed = await store.claim_runs("w1", [TARGET], RUNS, 30)
    monkeypatch.undo()
    assert sorted(r.id for r in claimed) == sorted(ids)
    assert seen["INSERT INTO events"] == 1
    assert seen["UPDATE runs SET"] == 0  # no event_seq bump per run
    assert sum(seen.values()) == 2, seen  # the claim and its events
    for run in claimed:
        assert [e[:3] for e in await store.read(_events, run.id)] == [
            (1, "run.submitted", "api"),
            (2, "run.claimed", "w1"),
        ]
        assert [e.data for e in await store.list_events(run.id)][-1] == {"epoch": 1}


async def test_claimed_again_the_seqs_go_on_without_a_gap(store: Store) -> None:
    run = await store.create_run(new_run())
    (first,) = await store.claim_runs("w1", [TARGET], 1, 30)
    assert await store.release_run(run.id, first.lease_epoch, "w1")
    (second,) = await store.claim_runs("w2", [TARGET], 1, 30)
    assert second.lease_epoch == 2
    assert [e[:3] for e in await store.read(_events, run.id)] == [
        (1, "run.submitted", "api"),
        (2, "run.claimed", "w1"),
        (3, "run.released", "w1"),
        (4, "run.claimed", "w2"),
    ]
    assert [e.data for e in await store.list_events(run.id)][-1] == {"epoch": 2}
    # the run's counter stands where the claim left it: the next journal write goes on
    await store.commit(batch(second, steps=[step(second)]))
    assert [e[:2] for e in await store.read(_events, run.id)][4:] == [(5, "step.succeeded")]


async def test_a_claim_of_more_runs_than_one_insert_takes_keeps_every_seq(store: Store) -> None:
    many = 1201  # three INSERTs of run.claimed events
    # Submitted in one transaction (the submit's own statements): the claim is the test.
    ids = set(
        await store.transact(lambda tx: [runs.create_run(tx, new_run()).id for _ in range(many)])
    )
    claimed = await store.claim_runs("w1", [TARGET], many, 30)
    assert {r.id for r in claimed} == ids

    def claimed_events(tx: Tx) -> list[tuple[str, int, str]]:
        found = tx.fetchall("SELECT run_id, seq, type FROM events ORDER BY run_id, seq")
        return [(str(e["run_id"]), int(e["seq"]), e["type"]) for e in found]

    expected = sorted(
        (run_id, seq, kind)
        for run_id in ids
        for seq, kind in ((1, "run.submitted"), (2, "run.claimed"))
    )
    assert await store.read(claimed_events) == expected


async def test_two_stores_claiming_at_once_keep_each_runs_seqs_gapless(store_url: str) -> None:
    """Two processes' stores claim the same runs at once, round after round: each run is
    claimed once per round and its events are 1, 2, 3, ... with no gap or repeat."""
    from agentledger.store import open_store

    stores = [open_store(store_url), open_store(store_url)]
    for s in stores:
        await s.open()
    try:
        ids = {(await stores[0].create_run(new_run())).id for _ in range(RUNS * 3)}
        for _ in range(4):
            got = await asyncio.gather(
                *(s.claim_runs(f"w{i}", [TARGET], len(ids), 30) for i, s in enumerate(stores))
            )
            claimed = [(i, r) for i, runs in enumerate(got) for r in runs]
            assert sorted(r.id for _, r in claimed) == sorted(ids)
            for i, r in claimed:
                assert await stores[i].release_run(r.id, r.lease_epoch, f"w{i}")
        for run_id in ids:
            found = await stores[1].read(_events, run_id)
            assert [e[0] for e in found] == list(range(1, 10))
            assert [e[1] for e in found][1:] == ["run.claimed", "run.released"] * 4
    finally:
        for s in stores:
            await s.close()


async def test_takeover_racing_the_old_owners_commit_keeps_the_seqs_gapless(
    store_url: str,
) -> None:
    """Each round the run's lease has expired: its owner commits a step while another
    process's store takes the run over. Whichever wins, the run's events are 1, 2, 3, ...
    and each claim's event carries its epoch, in order."""
    from agentledger.errors import LeaseLost
    from agentledger.store import open_store

    stores = [open_store(store_url), open_store(store_url)]
    for s in stores:
        await s.open()
    try:
        await stores[0].create_run(new_run())
        (held,) = await stores[0].claim_runs("w0", [TARGET], 1, -1)  # expired at once
        holder = 0
        for n in range(1, 31):
            other = 1 - holder
            wrote, took = await asyncio.gather(
                stores[holder].commit(batch(held, steps=[step(held, n)])),
                stores[other].claim_runs(f"w{other}", [TARGET], 1, -1),
                return_exceptions=True,
            )
            assert wrote is None or isinstance(wrote, LeaseLost), wrote
            assert isinstance(took, list), took
            if took:
                (held,), holder = took, other
        assert held.lease_epoch > 1  # taken over at least once
        found = await stores[1].read(_events, held.id)
        assert [e[0] for e in found] == list(range(1, len(found) + 1))
        epochs = [json.loads(e[3])["epoch"] for e in found if e[1] == "run.claimed"]
        assert epochs == list(range(1, held.lease_epoch + 1))
    finally:
        for s in stores:
            await s.close()
