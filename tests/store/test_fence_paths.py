"""The fence on every write path: a batch with a stale epoch, another owner's name, or for
a run that already ended writes NOTHING (run row, steps, effects, outbox, approvals,
events, dropped outbox rows) -- alone, in a group with valid batches, in a group that
falls back to one batch at a time, and (SQLite) in a group handed to a thread because
another process holds the write lock. Every backend (``store``)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentledger.errors import LeaseLost, StoreError
from agentledger.records import Approval, Effect, OutboxItem, Run, Step
from agentledger.store import Batch, NewEvent, NewRun, RunUpdate, Store, open_store
from agentledger.store._groupcommit import InlineCommitter

TARGET = "agent@1"
BAD_KINDS = ("stale_epoch", "other_owner", "terminal")


def new_run() -> NewRun:
    return NewRun(kind="agent", name="agent", version="1", input={"q": 1})


def entry(run: Run, step_no: int, **kw: Any) -> Step:
    fields: dict[str, Any] = {
        "kind": "tool",
        "name": "pay",
        "status": "succeeded",
        "output": {"ok": step_no},
        "idempotency_key": f"{run.id}:{step_no}",
        "lease_epoch": run.lease_epoch,
    }
    fields.update(kw)
    return Step(run_id=run.id, step_no=step_no, **fields)


def full_batch(run: Run, epoch: int, owner: str, tag: str, *, plain: bool = False) -> Batch:
    """A batch with every kind of write (or only a plain step + event: the one-statement
    path on PostgreSQL)."""
    now = time.time()
    events = [NewEvent("step.done", owner, {"tag": tag})]
    if plain:
        return Batch(
            run.id, epoch, owner, steps=[entry(run, 2)], run=RunUpdate(step_count=2), events=events
        )
    return Batch(
        run.id,
        epoch,
        owner,
        steps=[entry(run, 2), entry(run, 3)],
        run=RunUpdate(step_count=3, status="waiting", available_at=None, result={"tag": tag}),
        effects=[Effect(key=f"fx:{tag}:{run.id}", run_id=run.id, step_no=2, status="claimed")],
        outbox=[
            OutboxItem(key=f"ob:{tag}:{run.id}", run_id=run.id, step_no=2, tool="m", payload={})
        ],
        approvals=[
            Approval(
                id=f"ap:{tag}:{run.id}",
                run_id=run.id,
                step_no=3,
                tool="refund",
                arguments={},
                required_role="manager",
                requested_at=now,
                expires_at=now + 60,
                default_decision="reject",
            )
        ],
        events=events,
        drop_outbox=True,
    )


async def snapshot(store: Store, run_id: str) -> dict[str, Any]:
    """Everything a batch of ``run_id`` could write."""
    run = await store.get_run(run_id)
    assert run is not None
    effects = []
    for key in (f"fx:{t}:{run_id}" for t in ("bad", "good")):
        effects.append(await store.get_effect(key))
    return {
        "run": run,
        "steps": await store.load_journal(run_id),
        "effects": effects,
        "outbox": [o for o in await store.list_outbox() if o.run_id == run_id],
        "approvals": await store.get_approvals(run_id),
        "events": await store.list_events(run_id),
    }


async def prepare(store: Store, kind: str) -> tuple[Run, Batch, Batch]:
    """A run with one step and a pending outbox row (what drop_outbox would drop), and
    a bad batch of ``kind`` (full and plain) for it."""
    created = await store.create_run(new_run())
    (run,) = await store.claim_runs("w1", [TARGET], 1, 30)
    assert run.id == created.id and run.lease_owner == "w1"
    pending = OutboxItem(key=f"keep:{run.id}", run_id=run.id, step_no=1, tool="m", payload={})
    await store.commit(
        Batch(run.id, run.lease_epoch, "w1", steps=[entry(run, 1)], outbox=[pending])
    )
    epoch, owner = run.lease_epoch, "w1"
    if kind == "stale_epoch":
        await store.release_run(run.id, run.lease_epoch, "w1")
        (again,) = await store.claim_runs("w1", [TARGET], 1, 30)  # same owner, next epoch
        assert again.lease_epoch == epoch + 1
        run = again
    elif kind == "other_owner":
        owner = "w2"
    else:
        await store.commit(
            Batch(run.id, epoch, "w1", run=RunUpdate(status="completed", result={"ok": 1}))
        )
    return (
        run,
        full_batch(run, epoch, owner, "bad"),
        full_batch(run, epoch, owner, "bad", plain=True),
    )


@pytest.mark.parametrize("kind", BAD_KINDS)
async def test_a_fenced_out_batch_writes_nothing_alone(store: Store, kind: str) -> None:
    run, bad, bad_plain = await prepare(store, kind)
    before = await snapshot(store, run.id)
    for b in (bad, bad_plain):
        with pytest.raises(LeaseLost):
            await store.commit(b)
    assert await snapshot(store, run.id) == before


async def good_runs(store: Store, n: int) -> list[Run]:
    for _ in range(n):
        await store.create_run(new_run())
    runs = await store.claim_runs("g", [TARGET], n, 30)
    assert len(runs) == n
    return runs


@pytest.mark.parametrize("kind", BAD_KINDS)
async def test_a_fenced_out_batch_writes_nothing_in_a_group(store: Store, kind: str) -> None:
    run, bad, bad_plain = await prepare(store, kind)
    goods = await good_runs(store, 4)
    before = await snapshot(store, run.id)
    batches = [
        full_batch(r, r.lease_epoch, "g", "good", plain=i % 2 == 0) for i, r in enumerate(goods)
    ]
    outcomes = await asyncio.gather(
        *(store.commit(b) for b in [batches[0], bad, batches[1], bad_plain, *batches[2:]]),
        return_exceptions=True,
    )
    assert [type(o).__name__ for o in outcomes] == [
        "NoneType",
        "LeaseLost",
        "NoneType",
        "LeaseLost",
        "NoneType",
        "NoneType",
    ]
    assert await snapshot(store, run.id) == before
    for r in goods:
        assert (await store.load_journal(r.id))[-1].step_no >= 2


def poisoned(run: Run, other: Run) -> Batch:
    """A valid batch the database refuses: its step reuses another run's idempotency key
    (a unique index), which no validation before the group can see."""
    return Batch(
        run.id,
        run.lease_epoch,
        "g",
        steps=[entry(run, 2, idempotency_key=f"{other.id}:1")],
        run=RunUpdate(step_count=2),
        events=[NewEvent("step.done", "g", {"tag": "poison"})],
    )


@pytest.mark.parametrize("kind", BAD_KINDS)
async def test_a_fenced_out_batch_writes_nothing_when_the_group_falls_back(
    store: Store, kind: str
) -> None:
    run, bad, bad_plain = await prepare(store, kind)
    goods = await good_runs(store, 3)
    victim = goods[0]
    await store.commit(Batch(victim.id, victim.lease_epoch, "g", steps=[entry(victim, 1)]))
    before = await snapshot(store, run.id)
    outcomes = await asyncio.gather(
        store.commit(poisoned(goods[1], victim)),
        store.commit(bad),
        store.commit(full_batch(goods[2], goods[2].lease_epoch, "g", "good")),
        store.commit(bad_plain),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], StoreError) and not isinstance(outcomes[0], LeaseLost)
    assert isinstance(outcomes[1], LeaseLost) and isinstance(outcomes[3], LeaseLost)
    assert outcomes[2] is None
    assert await snapshot(store, run.id) == before
    assert [s.step_no for s in await store.load_journal(goods[1].id)] == []
    assert [s.step_no for s in await store.load_journal(goods[2].id)] == [2, 3]


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    """The lock hand-off to a thread is SQLite's: this test runs on SQLite only."""
    opened = open_store(f"sqlite:///{tmp_path / 'agentledger.db'}")
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.mark.parametrize("kind", BAD_KINDS)
async def test_sqlite_a_fenced_out_batch_writes_nothing_when_handed_to_a_thread(
    sqlite_store: Store, kind: str
) -> None:
    store = sqlite_store
    run, bad, bad_plain = await prepare(store, kind)
    goods = await good_runs(store, 2)
    before = await snapshot(store, run.id)
    path = store.url.split("sqlite:///", 1)[1]
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write lock
    try:
        commits = [
            asyncio.ensure_future(store.commit(b))
            for b in [bad, full_batch(goods[0], goods[0].lease_epoch, "g", "good"), bad_plain]
        ]
        await asyncio.sleep(0)  # the group runs in this loop turn and meets the lock
        await asyncio.sleep(0)
        inline = store._committers[0]
        assert isinstance(inline, InlineCommitter) and inline._waiting is not None  # handed off
        assert not any(c.done() for c in commits)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    outcomes = await asyncio.gather(*commits, return_exceptions=True)
    assert isinstance(outcomes[0], LeaseLost) and isinstance(outcomes[2], LeaseLost)
    assert outcomes[1] is None
    assert await snapshot(store, run.id) == before
