"""The store contract, written once and run on every backend (``store_url``)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agentledger.errors import LeaseLost, StoreError
from agentledger.records import Approval, Effect, OutboxItem, Run, Step, WorkerInfo
from agentledger.store import (
    AlreadyDecided,
    Batch,
    EffectClaimed,
    NewEvent,
    NewRun,
    RunUpdate,
    Store,
    UnstorableBatch,
    open_store,
)
from agentledger.store._tx import Tx

TARGET = "agent@1"


def new_run(name: str = "agent", version: str = "1", **kw: object) -> NewRun:
    return NewRun(kind="agent", name=name, version=version, input={"q": "hi"}, **kw)  # type: ignore[arg-type]


def step(run: Run, step_no: int = 1, **kw: object) -> Step:
    fields: dict[str, object] = {
        "kind": "tool",
        "name": "book",
        "status": "succeeded",
        "input": {"n": step_no},
        "output": {"ok": step_no},
        "idempotency_key": f"{run.id}:{step_no}",
        "lease_epoch": run.lease_epoch,
    }
    fields.update(kw)
    return Step(run_id=run.id, step_no=step_no, **fields)  # type: ignore[arg-type]


def batch(run: Run, /, **kw: object) -> Batch:
    assert run.lease_owner is not None
    return Batch(run_id=run.id, epoch=run.lease_epoch, owner=run.lease_owner, **kw)  # type: ignore[arg-type]


async def claim_one(store: Store, owner: str = "w1", lease: float = 30.0) -> Run:
    (run,) = await store.claim_runs(owner, [TARGET], 1, lease)
    return run


async def reopened(store: Store) -> Store:
    await store.close()
    again = open_store(store.url)
    await again.open()
    return again


# runs ------------------------------------------------------------------------------


async def test_create_get_list_count(store: Store) -> None:
    a = await store.create_run(new_run(tenant_id="t1", user_id="u1"))
    b = await store.create_run(new_run(name="other"))
    assert a.status == "queued" and a.lease_epoch == 0 and a.resumes == 0
    assert a.input == {"q": "hi"} and a.tenant_id == "t1" and a.user_id == "u1"
    assert a.available_at is not None and a.available_at <= time.time()
    got = await store.get_run(a.id)
    assert got == a
    assert await store.get_run("r-missing") is None
    assert [r.id for r in await store.list_runs()] == [b.id, a.id]  # newest first
    assert [r.id for r in await store.list_runs(name="other")] == [b.id]
    assert [r.id for r in await store.list_runs(status="queued", limit=1)] == [b.id]
    assert await store.list_runs(status="running") == []
    await claim_one(store)
    assert await store.count_runs() == {"queued": 1, "running": 1}
    events = await store.list_events(a.id)
    assert [e.type for e in events] == ["run.submitted", "run.claimed"]


# claim, lease, fence -----------------------------------------------------------


async def test_claim_sets_owner_expiry_and_epoch(store: Store) -> None:
    created = await store.create_run(new_run())
    before = time.time()
    run = await claim_one(store, "w1", lease=30)
    assert run.id == created.id
    assert run.status == "running" and run.lease_owner == "w1"
    assert run.lease_epoch == 1 and run.resumes == 0
    assert run.lease_expires_at is not None
    assert before + 29 < run.lease_expires_at < time.time() + 31
    assert await store.get_run(run.id) == run
    assert [e.type for e in await store.list_events(run.id)][-1] == "run.claimed"
    assert await store.lease_owners() == ["w1"]


async def test_live_lease_is_not_claimed_again(store: Store) -> None:
    await store.create_run(new_run())
    await claim_one(store, "w1")
    assert await store.claim_runs("w2", [TARGET], 10, 30) == []
    assert await store.claim_runs("w1", [TARGET], 10, 30) == []


async def test_expired_lease_is_claimable_and_counts_a_resume(store: Store) -> None:
    await store.create_run(new_run())
    first = await claim_one(store, "w1", lease=0.05)
    await asyncio.sleep(0.1)
    second = await claim_one(store, "w2")
    assert second.id == first.id
    assert second.lease_owner == "w2"
    assert second.lease_epoch == first.lease_epoch + 1
    assert second.resumes == 1


async def test_claim_only_listed_targets(store: Store) -> None:
    v1 = await store.create_run(new_run(version="1"))
    v2 = await store.create_run(new_run(version="2"))
    other = await store.create_run(new_run(name="other", version="1"))
    assert await store.claim_runs("w", [], 10, 30) == []
    assert [r.id for r in await store.claim_runs("w", ["agent@2"], 10, 30)] == [v2.id]
    got = await store.claim_runs("w", ["agent@1", "other@1", "nobody@9"], 10, 30)
    assert sorted(r.id for r in got) == sorted([v1.id, other.id])


async def test_claim_respects_limit_and_available_at(store: Store) -> None:
    now = time.time()
    later = await store.create_run(new_run(available_at=now + 3600))
    due = [await store.create_run(new_run(available_at=now - i)) for i in range(3)]
    got = await store.claim_runs("w", [TARGET], 2, 30)
    # The longest-due runs first (RETURNING order itself is unspecified).
    assert sorted(r.id for r in got) == sorted([due[2].id, due[1].id])
    got = await store.claim_runs("w", [TARGET], 10, 30)
    assert [r.id for r in got] == [due[0].id]
    assert await store.claim_runs("w", [TARGET], 10, 30) == []
    assert (await store.get_run(later.id)).status == "queued"  # type: ignore[union-attr]


async def test_renew_leases_reports_lost_leases(store: Store) -> None:
    a = await store.create_run(new_run())
    b = await store.create_run(new_run())
    mine = {r.id: r.lease_epoch for r in await store.claim_runs("w1", [TARGET], 2, 0.05)}
    await asyncio.sleep(0.1)
    (taken,) = await store.claim_runs("w2", [TARGET], 1, 30)
    kept = ({a.id, b.id} - {taken.id}).pop()
    # The lease of `kept` expired too, but nobody took it: renewing it is fine.
    assert await store.renew_leases("w1", mine, 30) == {taken.id}
    assert await store.renew_leases("w2", {taken.id: taken.lease_epoch}, 30) == set()
    run = await store.get_run(kept)
    assert run is not None and run.lease_expires_at is not None
    assert run.lease_expires_at > time.time() + 20


async def test_stale_epoch_commit_raises_lease_lost_and_writes_nothing(store: Store) -> None:
    await store.create_run(new_run())
    old = await claim_one(store, "w1", lease=0.05)
    await asyncio.sleep(0.1)
    new = await claim_one(store, "w2")
    events_before = await store.list_events(old.id)
    stale = batch(
        old,
        steps=[step(old)],
        run=RunUpdate(step_count=1, tokens=10, status="completed", result={"x": 1}),
        effects=[Effect(key="fx", run_id=old.id, step_no=1, status="claimed")],
        outbox=[OutboxItem(key="ob", run_id=old.id, step_no=1, tool="email", payload={})],
        events=[NewEvent("step.done", "w1")],
    )
    with pytest.raises(LeaseLost):
        await store.commit(stale)
    assert await store.load_journal(old.id) == []
    assert await store.get_run(old.id) == new
    assert await store.get_effect("fx") is None
    assert await store.list_outbox() == []
    assert await store.list_events(old.id) == events_before
    # The new owner's write goes through.
    await store.commit(batch(new, steps=[step(new)], run=RunUpdate(step_count=1)))
    assert [s.step_no for s in await store.load_journal(new.id)] == [1]


async def test_commit_writes_journal_and_run_update(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store)
    await store.commit(batch(run, steps=[step(run, 1, status="started", output=None)]))
    await store.commit(
        batch(
            run,
            steps=[step(run, 1), step(run, 2, tokens=7, cost_usd=0.5, duration_ms=12.5)],
            run=RunUpdate(step_count=2, tokens=7, cost_usd=0.5, active_seconds=1.5),
        )
    )
    journal = await store.load_journal(run.id)
    assert [(s.step_no, s.status) for s in journal] == [(1, "succeeded"), (2, "succeeded")]
    assert journal[0].output == {"ok": 1} and journal[0].idempotency_key == f"{run.id}:1"
    assert journal[1].tokens == 7 and journal[1].cost_usd == 0.5 and journal[1].duration_ms == 12.5
    got = await store.get_run(run.id)
    assert got is not None
    assert (got.step_count, got.tokens, got.cost_usd, got.active_seconds) == (2, 7, 0.5, 1.5)
    assert got.status == "running"
    await store.commit(
        batch(run, run=RunUpdate(status="completed", result={"answer": 42}, error=None))
    )
    done = await store.get_run(run.id)
    assert done is not None
    assert done.status == "completed" and done.result == {"answer": 42}
    assert done.lease_owner is None and done.lease_expires_at is None
    # A finished run accepts no more writes, even from its last owner.
    with pytest.raises(LeaseLost):
        await store.commit(batch(run, steps=[step(run, 3)]))


async def test_group_commit_fences_each_batch_and_is_durable(store: Store) -> None:
    for _ in range(50):
        await store.create_run(new_run())
    runs = await store.claim_runs("w1", [TARGET], 50, 30)
    assert len(runs) == 50
    existing = runs[0]
    await store.commit(
        batch(
            existing, effects=[Effect(key="taken", run_id=existing.id, step_no=1, status="claimed")]
        )
    )
    stale_run, effect_run = runs[7], runs[11]
    batches = []
    for run in runs:
        b = batch(run, steps=[step(run)], run=RunUpdate(step_count=1, tokens=3))
        if run is stale_run:
            b.epoch -= 1
        if run is effect_run:
            b.effects = [Effect(key="taken", run_id=run.id, step_no=1, status="claimed")]
        batches.append(b)

    # Hold the writer thread so that the batches it commits land in ONE group.
    gate = threading.Event()
    blocker = asyncio.ensure_future(store._call(lambda conn: gate.wait(10), write=False))
    await asyncio.sleep(0.05)
    commits = asyncio.gather(*(store.commit(b) for b in batches), return_exceptions=True)
    await asyncio.sleep(0.05)
    gate.set()
    await blocker
    outcomes = await commits
    # The batches committed together: all 50 in one group, or -- where the backend
    # commits plain batches from the event loop -- the 49 plain ones in one group and
    # the effect claim on the writer thread.
    assert max(store.group_sizes) >= 49

    failed = {b.run_id: o for b, o in zip(batches, outcomes, strict=True) if o is not None}
    assert set(failed) == {stale_run.id, effect_run.id}
    assert isinstance(failed[stale_run.id], LeaseLost)
    assert isinstance(failed[effect_run.id], EffectClaimed)

    store = await reopened(store)
    try:
        for run in runs:
            journal = await store.load_journal(run.id)
            got = await store.get_run(run.id)
            assert got is not None
            if run.id in failed:
                assert journal == [] and got.step_count == 0
            else:
                assert [s.step_no for s in journal] == [1] and got.step_count == 1
        effect = await store.get_effect("taken")
        assert effect is not None and effect.run_id == existing.id
    finally:
        await store.close()


async def test_effect_claims(store: Store) -> None:
    await store.create_run(new_run())
    await store.create_run(new_run())
    first, second = await store.claim_runs("w1", [TARGET], 2, 30)
    claim = Effect(key="charge:42", run_id=first.id, step_no=3, status="claimed")
    await store.commit(batch(first, effects=[claim]))
    with pytest.raises(EffectClaimed) as info:
        await store.commit(
            batch(
                second,
                steps=[step(second)],
                effects=[Effect(key="charge:42", run_id=second.id, step_no=3, status="claimed")],
            )
        )
    assert info.value.effect.run_id == first.id
    assert await store.load_journal(second.id) == []  # the whole batch was rolled back
    # Retrying its own claim (same run and step) is idempotent.
    await store.commit(batch(first, effects=[claim]))
    effect = await store.get_effect("charge:42")
    assert effect is not None
    assert (effect.run_id, effect.step_no, effect.status) == (first.id, 3, "claimed")
    # The same run at another step does not own it.
    with pytest.raises(EffectClaimed):
        await store.commit(
            batch(
                first,
                effects=[Effect(key="charge:42", run_id=first.id, step_no=4, status="claimed")],
            )
        )
    done = Effect(key="charge:42", run_id=first.id, step_no=3, status="done", result={"id": "ch_1"})
    await store.commit(batch(first, effects=[done]))
    effect = await store.get_effect("charge:42")
    assert effect is not None and effect.status == "done" and effect.result == {"id": "ch_1"}
    assert await store.get_effect("nope") is None


# outbox, approvals, events --------------------------------------------------------


async def test_outbox_insert_claim_settle(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store)
    item = OutboxItem(key="mail:1", run_id=run.id, step_no=2, tool="email", payload={"to": "a"})
    await store.commit(batch(run, outbox=[item]))
    duplicate = OutboxItem(
        key="mail:1", run_id=run.id, step_no=2, tool="email", payload={"to": "b"}
    )
    await store.commit(batch(run, outbox=[duplicate]))  # ignored, no error
    (row,) = await store.list_outbox()
    assert row.payload == {"to": "a"} and row.status == "pending" and row.attempts == 0

    (leased,) = await store.claim_outbox("d1", 10, 30)
    assert leased.key == "mail:1"
    assert await store.claim_outbox("d2", 10, 30) == []  # leased by d1

    leased.attempts = 1
    leased.status = "pending"
    leased.last_error = "smtp 451"
    leased.next_attempt_at = time.time() - 1
    leased.history = [{"attempt": 1, "error": "smtp 451"}]
    await store.settle_outbox(leased)
    (again,) = await store.claim_outbox("d2", 10, 30)  # lease released, due again
    assert again.attempts == 1 and again.last_error == "smtp 451"
    assert again.history == [{"attempt": 1, "error": "smtp 451"}]

    again.attempts = 2
    again.status = "delivered"
    again.history.append({"attempt": 2, "ok": True})
    await store.settle_outbox(again)
    assert await store.claim_outbox("d3", 10, 30) == []
    (delivered,) = await store.list_outbox("delivered")
    assert delivered.attempts == 2 and len(delivered.history) == 2
    assert await store.list_outbox("pending") == []


async def test_not_yet_due_outbox_is_not_claimed(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store)
    later = OutboxItem(
        key="crm:1",
        run_id=run.id,
        step_no=1,
        tool="crm",
        payload={},
        next_attempt_at=time.time() + 3600,
    )
    await store.commit(batch(run, outbox=[later]))
    assert await store.claim_outbox("d1", 10, 30) == []


async def test_approval_decision_requeues_waiting_run(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store)
    now = time.time()
    approval = Approval(
        id="ap1",
        run_id=run.id,
        step_no=4,
        tool="refund",
        arguments={"amount": 120},
        required_role="manager",
        requested_at=now,
        expires_at=now + 3600,
        default_decision="reject",
    )
    await store.commit(
        batch(run, approvals=[approval], run=RunUpdate(status="waiting", available_at=None))
    )
    parked = await store.get_run(run.id)
    assert parked is not None and parked.status == "waiting" and parked.lease_owner is None
    assert await store.claim_runs("w2", [TARGET], 10, 30) == []  # parked until decided
    (pending,) = await store.get_approvals(pending=True)
    assert pending.id == "ap1" and pending.arguments == {"amount": 120}
    assert pending.decision is None

    decided = await store.decide_approval("ap1", "approve", "alice")
    assert decided.decision == "approve" and decided.decided_by == "alice"
    assert await store.get_approvals(pending=True) == []
    (stored,) = await store.get_approvals(run_id=run.id)
    assert stored.decision == "approve" and stored.decided_at is not None
    with pytest.raises(StoreError):
        await store.decide_approval("ap1", "reject", "bob")
    with pytest.raises(StoreError):
        await store.decide_approval("nope", "reject", "bob")

    resumed = await store.get_run(run.id)
    assert resumed is not None and resumed.available_at is not None
    assert resumed.available_at <= time.time()
    (claimed,) = await store.claim_runs("w2", [TARGET], 10, 30)
    assert claimed.id == run.id and claimed.lease_epoch == run.lease_epoch + 1
    assert claimed.resumes == 0  # a parked run is not a crashed one
    assert "approval.decided" in [e.type for e in await store.list_events(run.id)]


async def test_events_are_appended_in_order(store: Store) -> None:
    run = await store.create_run(new_run())
    other = await store.create_run(new_run())
    for i in range(5):
        await store.append_event(run.id, f"e{i}", "tester", {"i": i})
        await store.append_event(other.id, "noise", "tester", None)
    events = await store.list_events(run.id)
    assert [e.type for e in events] == ["run.submitted", "e0", "e1", "e2", "e3", "e4"]
    assert [e.data for e in events[1:]] == [{"i": i} for i in range(5)]
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [e.type for e in await store.list_events(run.id, after_id=ids[3])] == ["e3", "e4"]
    everything = await store.list_events()
    assert len(everything) == 2 + 10
    assert [e.id for e in everything] == sorted(e.id for e in everything)
    assert [e.id for e in await store.list_events(after_id=everything[-2].id)] == [
        everything[-1].id
    ]


# release, cancel, expire ------------------------------------------------------------


async def test_release_run_makes_it_claimable_by_another_owner(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store, "w1")
    assert await store.release_run(run.id, run.lease_epoch - 1, "w1") is False
    assert await store.release_run(run.id, run.lease_epoch, "w2") is False
    assert await store.release_run(run.id, run.lease_epoch, "w1") is True
    released = await store.get_run(run.id)
    assert released is not None
    assert released.status == "queued" and released.lease_owner is None
    assert released.lease_expires_at is None
    taken = await claim_one(store, "w2")
    assert taken.id == run.id and taken.lease_epoch == run.lease_epoch + 1
    assert taken.resumes == 0
    with pytest.raises(LeaseLost):
        await store.commit(batch(run, steps=[step(run)]))


async def test_cancel_of_a_running_run_is_a_request_that_keeps_the_lease(store: Store) -> None:
    await store.create_run(new_run())
    other = await store.create_run(new_run())
    run = await claim_one(store, "w1")
    requested = await store.cancel_run(run.id, "user asked", "alice")
    # The worker honours it at the next step boundary: the epoch is never bumped, so
    # its in-flight write (and the compensation after it) still commits.
    assert requested.status == "running" and requested.cancel_requested == "user asked"
    assert requested.lease_epoch == run.lease_epoch and requested.lease_owner == "w1"
    assert await store.cancel_requests([run.id, other.id, "r-missing"]) == {run.id: "user asked"}
    assert await store.cancel_requests([]) == {}
    await store.commit(batch(run, steps=[step(run)], run=RunUpdate(step_count=1)))
    again = await store.cancel_run(run.id, "again", "bob")  # the first reason stays
    assert again.cancel_requested == "user asked" and again.status == "running"
    await store.commit(batch(run, run=RunUpdate(status="cancelled", error="user asked")))
    done = await store.cancel_run(run.id, "late", "carol")  # terminal: returned as it is
    assert done.status == "cancelled" and done.error == "user asked"
    types = [e.type for e in await store.list_events(run.id)]
    assert types.count("run.cancel_requested") == 1
    with pytest.raises(StoreError):
        await store.cancel_run("r-missing", "x", "bob")


async def test_cancel_never_overwrites_a_terminal_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentledger.store._queries import runs as run_queries

    await store.create_run(new_run())
    run = await claim_one(store, "w1")
    stale = await store.get_run(run.id)
    # The run completes between the cancel's read and its write (the race on a busy
    # server): the cancel sees the stale snapshot, its guarded UPDATE must not match.
    await store.commit(batch(run, run=RunUpdate(status="completed", result={"ok": True})))
    real_get_run = run_queries.get_run
    snapshots = [stale]

    def get_run_racing(tx: Tx, run_id: str) -> Run | None:
        return snapshots.pop() if snapshots else real_get_run(tx, run_id)

    monkeypatch.setattr(run_queries, "get_run", get_run_racing)
    after = await store.cancel_run(run.id, "too late", "alice")
    assert after.status == "completed" and after.result == {"ok": True}
    got = await store.get_run(run.id)
    assert got is not None and got.status == "completed" and got.error is None
    assert got.cancel_requested is None


async def test_cancel_a_waiting_run_makes_it_claimable(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store, "w1")
    await store.commit(
        batch(
            run, steps=[step(run)], run=RunUpdate(status="waiting", available_at=time.time() + 3600)
        )
    )
    assert await store.claim_runs("w2", [TARGET], 10, 30) == []
    requested = await store.cancel_run(run.id, "stop", "alice")
    assert requested.status == "queued" and requested.cancel_requested == "stop"
    assert requested.available_at is not None and requested.available_at <= time.time()
    (claimed,) = await store.claim_runs("w2", [TARGET], 10, 30)
    assert claimed.id == run.id and claimed.cancel_requested == "stop"
    assert claimed.lease_epoch == run.lease_epoch + 1


async def test_cancel_a_released_run_that_started_is_only_a_request(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store, "w1")
    await store.commit(batch(run, steps=[step(run, status="started", output=None)]))
    assert await store.release_run(run.id, run.lease_epoch, "w1")
    requested = await store.cancel_run(run.id, "stop", "alice")
    # A step may have reached a provider: a worker resolves it and compensates.
    assert requested.status == "queued" and requested.cancel_requested == "stop"


async def test_cancel_a_queued_run(store: Store) -> None:
    run = await store.create_run(new_run())
    cancelled = await store.cancel_run(run.id, "not needed", "alice")
    assert cancelled.status == "cancelled" and cancelled.error == "not needed"
    assert cancelled.lease_epoch == 0
    assert await store.claim_runs("w1", [TARGET], 10, 30) == []
    assert "run.cancelled" in [e.type for e in await store.list_events(run.id)]


async def test_expire_leases_of_dead_owner(store: Store) -> None:
    for _ in range(3):
        await store.create_run(new_run())
    dead = await store.claim_runs("dead", [TARGET], 2, 300)
    live = await claim_one(store, "live")
    assert sorted(await store.lease_owners()) == ["dead", "live"]
    assert await store.expire_leases_of(["dead"]) == 2
    assert await store.lease_owners() == ["live"]
    taken = await store.claim_runs("w2", [TARGET], 10, 30)
    assert sorted(r.id for r in taken) == sorted(r.id for r in dead)
    assert all(r.resumes == 1 for r in taken)
    assert (await store.get_run(live.id)).lease_owner == "live"  # type: ignore[union-attr]
    assert await store.expire_leases_of([]) == 0


# workers and versions ------------------------------------------------------------------


async def test_workers_register_heartbeat_list_deregister(store: Store) -> None:
    now = time.time()
    w1 = WorkerInfo(id="w1", host="h1", pid=11, targets=[TARGET], started_at=now, heartbeat_at=now)
    w2 = WorkerInfo(id="w2", host="h2", pid=22, targets=["b@2"], started_at=now, heartbeat_at=now)
    await store.register_worker(w1, {TARGET: "agent"})
    await store.register_worker(w2, {"b@2": "workflow", "b@3": "workflow"})
    workers = await store.list_workers()
    assert [w.id for w in workers] == ["w1", "w2"]
    assert workers[0].targets == [TARGET] and workers[0].pid == 11 and workers[0].host == "h1"
    assert [w.id for w in await store.list_workers(live_within=60)] == ["w1", "w2"]
    await asyncio.sleep(0.3)
    await store.heartbeat_worker("w1")
    assert [w.id for w in await store.list_workers(live_within=0.2)] == ["w1"]
    await store.register_worker(w2, {"b@2": "workflow"})  # re-register: a heartbeat
    assert len(await store.list_workers()) == 2
    await store.deregister_worker("w1")
    assert [w.id for w in await store.list_workers()] == ["w2"]
    regs = await store.registrations()
    assert [(r["target"], r["name"], r["version"], r["kind"]) for r in regs] == [
        (TARGET, "agent", "1", "agent"),
        ("b@2", "b", "2", "workflow"),
        ("b@3", "b", "3", "workflow"),
    ]
    # Registrations outlive the workers that made them.
    await store.deregister_worker("w2")
    assert await store.list_workers() == []
    assert len(await store.registrations()) == 3


async def test_store_must_be_opened(store_url: str) -> None:
    store = open_store(store_url)
    with pytest.raises(StoreError, match="not open"):
        await store.get_run("x")


# one approval decision wins --------------------------------------------------------


async def park_for_approval(store: Store, approval_id: str) -> Run:
    await store.create_run(new_run(version=approval_id))
    (run,) = await store.claim_runs("w1", [f"agent@{approval_id}"], 1, 30)
    now = time.time()
    approval = Approval(
        id=approval_id,
        run_id=run.id,
        step_no=1,
        tool="refund",
        arguments={"amount": 5},
        required_role="manager",
        requested_at=now,
        # Not expired: a person's decision at or after expiry is never recorded (see
        # tests/store/test_approval_expiry.py); the system's expiry default races it here.
        expires_at=now + 3600,
        default_decision="reject",
    )
    await store.commit(
        batch(run, approvals=[approval], run=RunUpdate(status="waiting", available_at=None))
    )
    return run


async def test_concurrent_deciders_exactly_one_wins(store: Store) -> None:
    # A human approving at the very moment the expiry applies its default: two
    # connections deciding at once. One wins; the other is told who won.
    other = open_store(store.url)
    await other.open()
    try:
        for i in range(8):
            run = await park_for_approval(store, f"ap{i}")
            outcomes = await asyncio.gather(
                store.decide_approval(f"ap{i}", "approve", "alice"),
                other.decide_approval(f"ap{i}", "reject", "system:expired"),
                return_exceptions=True,
            )
            won = [o for o in outcomes if isinstance(o, Approval)]
            lost = [o for o in outcomes if isinstance(o, BaseException)]
            assert len(won) == 1 and len(lost) == 1, outcomes
            assert isinstance(lost[0], AlreadyDecided)
            winner = won[0]
            assert f"already decided by {winner.decided_by}" in str(lost[0])
            assert lost[0].approval.decision == winner.decision
            (stored,) = await store.get_approvals(run_id=run.id)
            assert (stored.decision, stored.decided_by) == (winner.decision, winner.decided_by)
            decided = [e for e in await store.list_events(run.id) if e.type == "approval.decided"]
            assert [e.data["decision"] for e in decided] == [winner.decision]
    finally:
        await other.close()


async def test_same_decider_repeating_a_decision_gets_success(store: Store) -> None:
    run = await park_for_approval(store, "ap1")
    first = await store.decide_approval("ap1", "approve", "alice")
    again = await store.decide_approval("ap1", "approve", "alice")  # a retry
    assert (again.decision, again.decided_by, again.decided_at) == (
        first.decision,
        first.decided_by,
        first.decided_at,
    )
    with pytest.raises(AlreadyDecided, match="already decided by alice"):
        await store.decide_approval("ap1", "reject", "alice")
    with pytest.raises(AlreadyDecided, match="already decided by alice"):
        await store.decide_approval("ap1", "approve", "bob")
    decided = [e for e in await store.list_events(run.id) if e.type == "approval.decided"]
    assert len(decided) == 1


# outbox claims and settles are fenced -------------------------------------------------


async def test_stale_outbox_claimer_cannot_settle_or_free_a_delivered_row(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store)
    item = OutboxItem(key="mail:1", run_id=run.id, step_no=1, tool="email", payload={})
    await store.commit(batch(run, outbox=[item]))
    (slow,) = await store.claim_outbox("d1", 10, 0.05)  # d1 stalls past its lease
    await asyncio.sleep(0.1)
    (fast,) = await store.claim_outbox("d2", 10, 30)
    assert fast.claim_epoch == slow.claim_epoch + 1 and fast.lease_owner == "d2"
    fast.attempts, fast.status = 1, "delivered"
    assert await store.settle_outbox(fast) is True
    # d1 wakes up and reports a failed attempt to retry: refused, nothing written.
    slow.attempts, slow.status, slow.last_error = 1, "pending", "timeout"
    slow.next_attempt_at = time.time() - 1
    assert await store.settle_outbox(slow) is False
    (row,) = await store.list_outbox()
    assert row.status == "delivered" and row.last_error is None
    assert await store.claim_outbox("d3", 10, 30) == []  # never sent twice
    # The same settle retried (after a lost reply) is accepted again: idempotent.
    assert await store.settle_outbox(fast) is True


async def test_only_pending_outbox_rows_are_claimed(store: Store) -> None:
    await store.create_run(new_run())
    run = await claim_one(store)
    item = OutboxItem(key="mail:1", run_id=run.id, step_no=1, tool="email", payload={})
    await store.commit(batch(run, outbox=[item]))
    (leased,) = await store.claim_outbox("d1", 10, 0.05)
    leased.attempts, leased.status = 1, "dead"
    assert await store.settle_outbox(leased) is True
    await asyncio.sleep(0.1)
    assert await store.claim_outbox("d2", 10, 30) == []


async def test_drop_outbox_drops_pending_unclaimed_rows_of_the_run(store: Store) -> None:
    await store.create_run(new_run())
    await store.create_run(new_run())
    run, other = await store.claim_runs("w1", [TARGET], 2, 30)

    def mail(key: str, r: Run) -> OutboxItem:
        return OutboxItem(key=key, run_id=r.id, step_no=1, tool="email", payload={"k": key})

    await store.commit(batch(run, outbox=[mail("a:held", run)]))
    (_held,) = await store.claim_outbox("d1", 10, 30)  # a live claim: mid-delivery
    await store.commit(batch(run, outbox=[mail("b:sent", run)]))
    (sent,) = await store.claim_outbox("d1", 10, 30)
    sent.attempts, sent.status = 1, "delivered"
    assert await store.settle_outbox(sent)
    await store.commit(batch(run, outbox=[mail("c:pending", run)]))
    await store.commit(batch(other, outbox=[mail("d:other", other)]))

    await store.commit(batch(run, steps=[step(run, 2)], drop_outbox=True))
    status = {o.key: o for o in await store.list_outbox()}
    assert {k: o.status for k, o in status.items()} == {
        "a:held": "pending",
        "b:sent": "delivered",
        "c:pending": "dropped",
        "d:other": "pending",
    }
    assert "compensation" in str(status["c:pending"].history[-1])
    (claimable,) = await store.claim_outbox("d2", 10, 30)
    assert claimable.key == "d:other"
    # A stale batch's drop writes nothing.
    await store.commit(batch(run, outbox=[mail("e:late", run)]))
    stale = batch(run, drop_outbox=True)
    stale.epoch -= 1
    with pytest.raises(LeaseLost):
        await store.commit(stale)
    assert {o.key: o.status for o in await store.list_outbox()}["e:late"] == "pending"


# leases on the database's clock -----------------------------------------------------


class SkewedTime:
    """A stand-in for the ``time`` module whose clock is off by ``offset`` seconds."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def skew(monkeypatch: pytest.MonkeyPatch, offset: float) -> None:
    """Shift the store's notion of "now" (every store module that reads the clock)."""
    from agentledger.store import _queries as queries
    from agentledger.store._queries import approvals, common, events, journal, outbox, runs
    from agentledger.store._queries import workers as worker_queries

    modules = [queries, approvals, common, events, journal, outbox, runs, worker_queries]
    for module in modules:
        if hasattr(module, "time"):
            monkeypatch.setattr(module, "time", SkewedTime(offset))


async def test_a_clock_ahead_cannot_steal_a_live_lease(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create_run(new_run())
    mine = await claim_one(store, "w1", lease=30)
    skew(monkeypatch, +60)  # worker 2 runs 60 s ahead
    assert await store.claim_runs("w2", [TARGET], 10, 30) == []
    assert await store.lease_owners() == ["w1"]
    item = OutboxItem(key="m", run_id=mine.id, step_no=1, tool="email", payload={})
    monkeypatch.undo()
    await store.commit(batch(mine, outbox=[item]))
    assert len(await store.claim_outbox("d1", 10, 30)) == 1
    skew(monkeypatch, +60)
    assert await store.claim_outbox("d2", 10, 30) == []


async def test_a_clock_behind_keeps_its_own_lease(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create_run(new_run())
    await store.create_run(new_run())
    skew(monkeypatch, -60)  # worker 1 runs 60 s behind: claims and renews
    first = await claim_one(store, "w1", lease=30)
    assert await store.renew_leases("w1", {first.id: first.lease_epoch}, 30) == set()
    assert await store.lease_owners() == ["w1"]
    monkeypatch.undo()
    (taken,) = await store.claim_runs("w2", [TARGET], 10, 30)
    assert taken.id != first.id  # only the other, queued run
    got = await store.get_run(first.id)
    assert got is not None and got.lease_owner == "w1"
    assert got.lease_expires_at is not None and got.lease_expires_at > time.time() + 20
    assert sorted(await store.lease_owners()) == ["w1", "w2"]


# poisoned values fail alone -----------------------------------------------------------

POISON = "bad \ud83d text \x00 end"


async def test_lone_surrogates_and_nul_are_journaled_sanitized(store: Store) -> None:
    for _ in range(6):
        await store.create_run(new_run())
    runs = await store.claim_runs("w1", [TARGET], 6, 30)
    batches = []
    for i, run in enumerate(runs):
        s = step(run)
        if i % 2 == 0:  # every other run carries provider garbage, in every place
            s = step(
                run,
                name=f"tool{POISON}",
                status="failed",
                output={"text": POISON, POISON: [POISON]},
                error=POISON,
                error_class="provider_error",
            )
        batches.append(
            batch(
                run,
                steps=[s],
                run=RunUpdate(step_count=1, error=POISON if i % 2 == 0 else None),
                events=[NewEvent("step.failed", "w1", {"error": POISON})],
            )
        )
    # One loop turn: the batches are committed as one group.
    outcomes = await asyncio.gather(*(store.commit(b) for b in batches), return_exceptions=True)
    assert outcomes == [None] * len(runs)
    clean = "bad \ufffd text \ufffd end"
    for i, run in enumerate(runs):
        (got,) = await store.load_journal(run.id)
        if i % 2 == 0:
            assert got.name == f"tool{clean}" and got.error == clean
            assert got.output == {"text": clean, clean: [clean]}
            assert (await store.get_run(run.id)).error == clean  # type: ignore[union-attr]
        events = await store.list_events(run.id)
        assert events[-1].data == {"error": clean}


async def test_an_unstorable_batch_fails_alone(store: Store) -> None:
    for _ in range(4):
        await store.create_run(new_run())
    runs = await store.claim_runs("w1", [TARGET], 4, 30)
    deep: Any = "leaf"
    for _ in range(5000):
        deep = [deep]
    poisoned = {runs[1].id: step(runs[1], tokens=2**70), runs[2].id: step(runs[2], output=deep)}
    batches = [
        batch(r, steps=[poisoned.get(r.id) or step(r)], run=RunUpdate(step_count=1)) for r in runs
    ]
    outcomes = await asyncio.gather(*(store.commit(b) for b in batches), return_exceptions=True)
    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], UnstorableBatch) and "64 bits" in str(outcomes[1])
    assert isinstance(outcomes[2], UnstorableBatch) and runs[2].id in str(outcomes[2])
    assert len(await store.load_journal(runs[0].id)) == 1
    assert len(await store.load_journal(runs[3].id)) == 1
    assert await store.load_journal(runs[1].id) == []


async def test_a_group_the_database_refuses_falls_back_to_one_batch_at_a_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch that passes validation and is refused by the database all the same.
    from agentledger.store import _sqlstore as sqlstore

    monkeypatch.setattr(sqlstore.journal, "validate_batch", lambda batch: None)
    for _ in range(5):
        await store.create_run(new_run())
    runs = await store.claim_runs("w1", [TARGET], 5, 30)
    batches = [
        batch(r, steps=[step(r, tokens=2**70 if i == 2 else 1)], run=RunUpdate(step_count=1))
        for i, r in enumerate(runs)
    ]
    outcomes = await asyncio.gather(*(store.commit(b) for b in batches), return_exceptions=True)
    assert [o is None for o in outcomes] == [True, True, False, True, True], outcomes
    assert isinstance(outcomes[2], StoreError)
    for i, run in enumerate(runs):
        assert len(await store.load_journal(run.id)) == (0 if i == 2 else 1)
