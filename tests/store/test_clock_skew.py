"""A worker whose clock is a minute off parks a run, delays an outbox row and submits a
delayed run for as long as it meant, on the database's clock: never a minute too long
(parked "forever" for a short wait) nor a minute too short (woken at once)."""

from __future__ import annotations

import time

import pytest

from agentledger.records import OutboxItem
from agentledger.store import Batch, NewRun, RunUpdate, Store
from tests.store.test_contract import SkewedTime, skew

TARGET = "agent@1"
WAIT = 5.0


def worker_now(offset: float) -> float:
    return SkewedTime(offset).time()


@pytest.mark.parametrize("offset", [+60.0, -60.0])
async def test_a_skewed_worker_parks_for_as_long_as_it_meant(
    store: Store, monkeypatch: pytest.MonkeyPatch, offset: float
) -> None:
    await store.create_run(NewRun(kind="agent", name="agent", version="1", input={}))
    (run,) = await store.claim_runs("w1", [TARGET], 1, 30)
    skew(monkeypatch, offset)
    until = worker_now(offset) + WAIT  # what the engine computes on its own clock
    await store.commit(
        Batch(
            run.id,
            run.lease_epoch,
            "w1",
            run=RunUpdate(status="waiting", available_at=until),
            outbox=[
                OutboxItem(
                    key="m",
                    run_id=run.id,
                    step_no=1,
                    tool="email",
                    payload={},
                    next_attempt_at=until,
                )
            ],
        )
    )
    delayed = await store.create_run(
        NewRun(kind="agent", name="agent", version="1", input={}, available_at=until)
    )
    monkeypatch.undo()
    real = time.time()  # the database's clock (same host)
    got = await store.get_run(run.id)
    assert got is not None and got.available_at is not None
    assert got.available_at == pytest.approx(real + WAIT, abs=2.0)
    assert delayed.available_at == pytest.approx(real + WAIT, abs=2.0)
    (row,) = await store.list_outbox()
    assert row.next_attempt_at == pytest.approx(real + WAIT, abs=2.0)
    assert await store.claim_runs("w2", [TARGET], 5, 30) == []  # not due yet (behind)
    # The dispatcher, also skewed, settles a retry in WAIT seconds.
    with monkeypatch.context() as m:
        from agentledger.store._queries import outbox as outbox_queries

        m.setattr(outbox_queries, "time", SkewedTime(offset))
        from agentledger.store._queries import common

        m.setattr(common, "time", SkewedTime(offset))
        due = await store._call(lambda tx: tx.execute("UPDATE outbox SET next_attempt_at = 0"))
        assert due == 1
        (claimed,) = await store.claim_outbox("d1", 5, 30)
        claimed.next_attempt_at = worker_now(offset) + WAIT
        claimed.attempts = 1
        assert await store.settle_outbox(claimed)
    (row,) = await store.list_outbox()
    assert row.next_attempt_at == pytest.approx(time.time() + WAIT, abs=2.0)
