"""PostgreSQL: a COMMIT whose reply is lost (the server committed) is retried by the
store; every retried operation is idempotent -- one submit makes one run, a committed
decision or batch is reported as committed, nothing is written twice."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentledger.records import Approval, OutboxItem, Run, Step
from agentledger.store import Batch, NewEvent, NewRun, RunUpdate, Store
from tests.store.pgproxy import COMMIT, READY_FOR_QUERY, LossyProxy

pytestmark = pytest.mark.postgres

TARGET = "agent@1"


@pytest.fixture
def store(proxied_store: Store) -> Store:
    """Every test here talks to PostgreSQL through the lossy proxy."""
    return proxied_store


def new_run() -> NewRun:
    return NewRun(kind="agent", name="agent", version="1", input={"q": 1})


def finish(run: Run, **kw: object) -> Batch:
    assert run.lease_owner is not None
    entry = Step(
        run_id=run.id,
        step_no=1,
        kind="tool",
        name="t",
        status="succeeded",
        output={"ok": 1},
        lease_epoch=run.lease_epoch,
    )
    return Batch(
        run_id=run.id,
        epoch=run.lease_epoch,
        owner=run.lease_owner,
        steps=[entry],
        run=RunUpdate(step_count=1, status="completed", result={"done": True}),
        events=[NewEvent("run.completed", run.lease_owner)],
        **kw,  # type: ignore[arg-type]
    )


async def test_a_submit_whose_commit_reply_is_lost_makes_one_run(
    store: Store, proxy: LossyProxy
) -> None:
    proxy.arm(COMMIT)
    run = await store.create_run(new_run())
    assert proxy.cut.is_set()  # the reply really was lost, after the server committed
    assert await store.count_runs() == {"queued": 1}
    assert [r.id for r in await store.list_runs()] == [run.id]
    assert [e.type for e in await store.list_events(run.id)] == ["run.submitted"]
    # The caller resending with the same request id gets the same run, too.
    again = await store.create_run(
        NewRun(kind="agent", name="agent", version="1", input={}, request_id=run.request_id)
    )
    assert again.id == run.id and await store.count_runs() == {"queued": 1}


async def test_a_claim_whose_commit_reply_is_lost_returns_its_runs(
    store: Store, proxy: LossyProxy
) -> None:
    created = await store.create_run(new_run())
    proxy.arm(COMMIT)
    (run,) = await store.claim_runs("w1", [TARGET], 5, 30)
    assert proxy.cut.is_set()
    assert run.id == created.id and run.lease_epoch == 1 and run.lease_owner == "w1"
    assert await store.get_run(run.id) == run
    claims = [e for e in await store.list_events(run.id) if e.type == "run.claimed"]
    assert len(claims) == 1


async def test_a_decision_whose_commit_reply_is_lost_is_reported_decided(
    store: Store, proxy: LossyProxy
) -> None:
    await store.create_run(new_run())
    (run,) = await store.claim_runs("w1", [TARGET], 1, 30)
    now = time.time()
    approval = Approval(
        id="ap1",
        run_id=run.id,
        step_no=1,
        tool="refund",
        arguments={},
        required_role="manager",
        requested_at=now,
        expires_at=now + 60,
        default_decision="reject",
    )
    assert run.lease_owner is not None
    await store.commit(
        Batch(
            run_id=run.id,
            epoch=run.lease_epoch,
            owner=run.lease_owner,
            approvals=[approval],
            run=RunUpdate(status="waiting"),
        )
    )
    proxy.arm(COMMIT)
    decided = await store.decide_approval("ap1", "approve", "alice")
    assert proxy.cut.is_set()
    assert decided.decision == "approve" and decided.decided_by == "alice"
    events = [e for e in await store.list_events(run.id) if e.type == "approval.decided"]
    assert len(events) == 1


async def test_a_journal_statement_whose_reply_is_lost_is_not_reported_lost(
    store: Store, proxy: LossyProxy
) -> None:
    await store.create_run(new_run())
    (run,) = await store.claim_runs("w1", [TARGET], 1, 30)
    # A lone plain batch is one autocommitted statement: lose its answer.
    proxy.arm(b"WITH fence", READY_FOR_QUERY)
    await store.commit(finish(run))  # committed: no LeaseLost, although its fence now fails
    assert proxy.cut.is_set()
    got = await store.get_run(run.id)
    assert got is not None and got.status == "completed"
    assert [e.type for e in await store.list_events(run.id)].count("run.completed") == 1


async def test_a_journal_group_whose_commit_reply_is_lost_is_not_applied_twice(
    store: Store, proxy: LossyProxy
) -> None:
    for _ in range(4):
        await store.create_run(new_run())
    runs = await store.claim_runs("w1", [TARGET], 4, 30)
    stale = finish(runs[3])
    stale.epoch -= 1  # refused by its fence in the group that commits
    proxy.arm(COMMIT)
    outcomes = await asyncio.gather(
        *(store.commit(finish(r)) for r in runs[:3]), store.commit(stale), return_exceptions=True
    )
    assert proxy.cut.is_set()
    assert outcomes[:3] == [None, None, None]
    assert type(outcomes[3]).__name__ == "LeaseLost"
    for run in runs[:3]:
        got = await store.get_run(run.id)
        assert got is not None and got.status == "completed"
        assert [e.type for e in await store.list_events(run.id)].count("run.completed") == 1


async def test_a_batch_with_outbox_rows_whose_commit_reply_is_lost(
    store: Store, proxy: LossyProxy
) -> None:
    await store.create_run(new_run())
    (run,) = await store.claim_runs("w1", [TARGET], 1, 30)
    item = OutboxItem(key="mail:1", run_id=run.id, step_no=1, tool="email", payload={})
    proxy.arm(COMMIT)
    await store.commit(finish(run, outbox=[item]))  # the writer thread's path
    assert proxy.cut.is_set()
    assert [o.key for o in await store.list_outbox()] == ["mail:1"]
    assert [e.type for e in await store.list_events(run.id)].count("run.completed") == 1
