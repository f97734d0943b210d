"""A submit writes its run and the run's ``run.submitted`` event and reads nothing back:
the row comes back from its INSERT, which also takes the event's seq, and a retried
submit (its request id already used) meets the unique index and returns the run the
first attempt made. On PostgreSQL the run, its event and the hint to idle workers are
one statement (each statement is a round trip there, paid once per run)."""

from __future__ import annotations

import dataclasses
import queue

import pytest

from agentledger.store import Store, open_store
from agentledger.store._postgres import connect
from agentledger.store._postgres.listen import RunListener, notify_runs
from tests.store.test_claim_statements import _events, _spy
from tests.store.test_contract import TARGET, new_run


async def test_a_submit_is_its_writes_and_nothing_read_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = dataclasses.replace(new_run(), request_id="req-1")
    seen = _spy(store, monkeypatch)
    run = await store.create_run(new)
    monkeypatch.undo()
    if store.dialect.name == "postgres":
        assert seen == {"WITH run AS": 1}, seen
    else:
        assert seen == {"INSERT INTO runs": 1, "INSERT INTO events": 1}, seen
    assert run == await store.get_run(run.id)
    assert [e[:3] for e in await store.read(_events, run.id)] == [(1, "run.submitted", "api")]
    assert [e.data for e in await store.list_events(run.id)] == [{"input": {"q": "hi"}}]

    again = await store.create_run(new)  # a retried submit: the same run, no new event
    assert again == run
    assert len(await store.read(_events, run.id)) == 1
    (claimed,) = await store.claim_runs("w1", [TARGET], 1, 30)
    assert [e[:3] for e in await store.read(_events, claimed.id)] == [
        (1, "run.submitted", "api"),
        (2, "run.claimed", "w1"),
    ]


@pytest.mark.postgres
async def test_a_submit_hints_idle_workers_once_and_a_retried_one_does_not(pg_url: str) -> None:
    got: queue.Queue[str] = queue.Queue()
    listener = RunListener(pg_url, got.put, poll_interval=0.05)
    store = open_store(pg_url)
    await store.open()
    listener.start()
    try:
        assert listener.wait_listening(10)
        new = dataclasses.replace(new_run(), request_id="req-2")
        await store.create_run(new)
        assert got.get(timeout=5) == ""
        await store.create_run(new)  # the same request: no run, no hint
        sender = connect(pg_url)
        try:
            notify_runs(sender, "mark")  # after the retried submit's commit, in order
            sender.commit()
        finally:
            sender.close()
        assert got.get(timeout=5) == "mark"
    finally:
        listener.stop()
        await store.close()
