"""A submit writes its run and the run's ``run.submitted`` event and reads nothing back:
the row comes back from its INSERT, which also takes the event's seq, and a retried
submit (its request id already used) meets the unique index and returns the run the
first attempt made. On PostgreSQL each statement is a round trip, paid once per run."""

from __future__ import annotations

import dataclasses

import pytest

from agentledger.store import Store
from tests.store.test_claim_statements import _events, _spy
from tests.store.test_contract import TARGET, new_run


async def test_a_submit_is_its_writes_and_nothing_read_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = dataclasses.replace(new_run(), request_id="req-1")
    seen = _spy(store, monkeypatch)
    run = await store.create_run(new)
    monkeypatch.undo()
    assert seen["INSERT INTO runs"] == 1 and seen["INSERT INTO events"] == 1
    assert not any(k.startswith("SELECT") or k.startswith("UPDATE") for k in seen), seen
    assert run == await store.get_run(run.id)
    assert [e[:3] for e in await store.read(_events, run.id)] == [(1, "run.submitted", "api")]

    again = await store.create_run(new)  # a retried submit: the same run, no new event
    assert again == run
    assert len(await store.read(_events, run.id)) == 1
    (claimed,) = await store.claim_runs("w1", [TARGET], 1, 30)
    assert [e[:3] for e in await store.read(_events, claimed.id)] == [
        (1, "run.submitted", "api"),
        (2, "run.claimed", "w1"),
    ]
