"""A journal batch the engine sends again after a store error (``Batch.resent``) whose
first attempt committed after all -- the store answered an error, or the answer was
lost -- is found by its token and not applied twice; one whose first attempt did not
commit is still fenced out when another worker took the run meanwhile. Both
backends, each commit path (SQLite's inline group, PostgreSQL's async committer for
plain batches and its writer thread for batches with outbox rows)."""

from __future__ import annotations

import pytest

from agentledger.errors import LeaseLost
from agentledger.records import OutboxItem, Run, Step
from agentledger.store import Batch, NewEvent, NewRun, RunUpdate, Store

TARGET = "agent@1"


async def _claimed(store: Store, owner: str = "w1") -> Run:
    await store.create_run(NewRun(kind="agent", name="agent", version="1", input={}))
    (run,) = await store.claim_runs(owner, [TARGET], 1, 300)
    return run


def _step(run: Run, step_no: int, status: str = "succeeded") -> Batch:
    """A mid-run batch: a step journaled, the run still running."""
    assert run.lease_owner is not None
    return Batch(
        run_id=run.id,
        epoch=run.lease_epoch,
        owner=run.lease_owner,
        steps=[
            Step(
                run_id=run.id,
                step_no=step_no,
                kind="tool",
                name="t",
                status=status,
                output={"n": step_no} if status == "succeeded" else None,
                lease_epoch=run.lease_epoch,
            )
        ],
        run=RunUpdate(step_count=step_no),
        events=[NewEvent("step.journaled", run.lease_owner, {"step": step_no})],
    )


async def _journaled_events(store: Store, run_id: str) -> list[int]:
    return [e.data["step"] for e in await store.list_events(run_id) if e.type == "step.journaled"]


@pytest.mark.parametrize("outbox", [False, True], ids=["plain", "outbox"])
async def test_a_resent_batch_that_had_committed_is_answered_not_applied_again(
    store: Store, outbox: bool
) -> None:
    run = await _claimed(store)
    batch = _step(run, 1)
    if outbox:
        batch.outbox = [
            OutboxItem(key="mail:1", run_id=run.id, step_no=1, tool="email", payload={})
        ]
    await store.commit(batch)
    batch.resent = True  # the engine saw an error: it cannot know this one committed
    await store.commit(batch)
    journal = await store.load_journal(run.id)
    assert [(s.step_no, s.status) for s in journal] == [(1, "succeeded")]
    assert await _journaled_events(store, run.id) == [1]
    if outbox:
        assert [o.key for o in await store.list_outbox()] == ["mail:1"]
    # The run goes on: its next step is journaled after it.
    await store.commit(_step(run, 2))
    assert [s.step_no for s in await store.load_journal(run.id)] == [1, 2]


async def test_a_resent_write_start_is_journaled_once_and_its_outcome_follows(
    store: Store,
) -> None:
    # A write step's start, committed with its answer lost: found when resent, so the
    # call is made once under the one start, and its outcome completes that step.
    run = await _claimed(store)
    started = _step(run, 1, "started")
    await store.commit(started)
    started.resent = True
    await store.commit(started)
    assert [(s.step_no, s.status) for s in await store.load_journal(run.id)] == [(1, "started")]
    await store.commit(_step(run, 1))
    assert [(s.step_no, s.status) for s in await store.load_journal(run.id)] == [(1, "succeeded")]
    assert await _journaled_events(store, run.id) == [1, 1]


async def test_a_resent_batch_is_fenced_out_once_another_worker_took_the_run(
    store: Store,
) -> None:
    run = await _claimed(store)
    await store.commit(_step(run, 1))
    late = _step(run, 2)
    late.resent = True  # its first attempt failed and did not commit
    assert await store.expire_leases_of(["w1"]) == 1
    (taken,) = await store.claim_runs("w2", [TARGET], 1, 300)
    assert taken.lease_epoch == run.lease_epoch + 1
    with pytest.raises(LeaseLost):
        await store.commit(late)
    assert [s.step_no for s in await store.load_journal(run.id)] == [1]
    assert await _journaled_events(store, run.id) == [1]
    # The old owner's release, fenced by epoch, leaves the new owner's lease alone.
    assert await store.release_run(run.id, run.lease_epoch, "w1") is False
    now = await store.get_run(run.id)
    assert now is not None and now.lease_owner == "w2" and now.status == "running"
