"""Hostile values through every store method, on every backend: NUL and lone surrogates
are stored sanitized and a retried write still recognises itself; NaN, the infinities and
integers past 64 bits are refused before anything is written (stored, they would park a
run forever, pin a lease that never expires, or be JSON no reader can parse)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentledger.errors import StoreError
from agentledger.records import Approval, Effect, OutboxItem, Run, Step
from agentledger.store import (
    Batch,
    NewEvent,
    NewRun,
    RunUpdate,
    Store,
    UnstorableBatch,
    UnstorableValue,
)

TARGET = "agent@1"
BAD = "x\x00y\ud800z"
CLEAN = "x\ufffdy\ufffdz"
NAN, INF = float("nan"), float("inf")


def new_run(**kw: Any) -> NewRun:
    fields: dict[str, Any] = {"kind": "agent", "name": "agent", "version": "1", "input": {}}
    fields.update(kw)
    return NewRun(**fields)


async def claimed(store: Store, owner: str = "w1") -> Run:
    await store.create_run(new_run())
    (run,) = await store.claim_runs(owner, [TARGET], 1, 30)
    return run


async def test_text_with_nul_and_surrogates_is_stored_sanitized_everywhere(
    store: Store,
) -> None:
    run = await store.create_run(
        new_run(input={BAD: BAD}, tenant_id=BAD, user_id=BAD, request_id=BAD)
    )
    assert (run.tenant_id, run.user_id, run.input) == (CLEAN, CLEAN, {CLEAN: CLEAN})
    again = await store.create_run(new_run(request_id=BAD))  # the same submit, retried
    assert again.id == run.id
    (mine,) = await store.claim_runs(BAD, [TARGET], 1, 30)  # an owner id with NUL
    assert await store.renew_leases(BAD, {mine.id: mine.lease_epoch}, 30) == set()
    await store.commit(Batch(mine.id, mine.lease_epoch, BAD, events=[NewEvent(BAD, BAD, BAD)]))
    cancelled = await store.cancel_run(mine.id, BAD, BAD)
    assert cancelled.cancel_requested == CLEAN
    assert await store.cancel_requests([mine.id, BAD]) == {mine.id: CLEAN}
    await store.append_event(mine.id, BAD, BAD, {BAD: [BAD]})
    assert (await store.list_events(mine.id))[-1].data == {CLEAN: [CLEAN]}
    assert await store.release_run(mine.id, mine.lease_epoch, BAD)


async def test_an_effect_swap_with_hostile_text_recognises_its_own_row(store: Store) -> None:
    """A retried swap (after a lost reply) must find its own write; comparing the raw
    values with the sanitized row said "someone else's" and the outbox gave up."""
    run = await claimed(store)
    effect = Effect(key=BAD, run_id=run.id, step_no=1, status="claimed", result={BAD: (BAD,)})
    assert (await store.swap_effect(effect, None))[0]
    written, current = await store.swap_effect(effect, None)  # the same write again
    assert written and current is not None and current.key == CLEAN
    other = Effect(key=BAD, run_id=run.id, step_no=2, status="claimed")
    assert not (await store.swap_effect(other, None))[0]


async def test_create_run_refuses_what_would_park_it_forever(store: Store) -> None:
    for bad in ({"available_at": NAN}, {"available_at": INF}, {"input": {"x": NAN}}):
        with pytest.raises(UnstorableValue):
            await store.create_run(new_run(**bad))
    assert await store.count_runs() == {}


@pytest.mark.parametrize("lease", [NAN, INF, -INF])
async def test_a_lease_that_never_expires_is_refused(store: Store, lease: float) -> None:
    run = await store.create_run(new_run())
    with pytest.raises(UnstorableValue):
        await store.claim_runs("w1", [TARGET], 1, lease)
    got = await store.get_run(run.id)
    assert got is not None and got.status == "queued" and got.lease_owner is None
    mine = await claimed(store)
    with pytest.raises(UnstorableValue):
        await store.renew_leases("w1", {mine.id: mine.lease_epoch}, lease)
    after = await store.get_run(mine.id)
    assert after is not None and after.lease_expires_at == mine.lease_expires_at
    with pytest.raises(UnstorableValue):
        await store.claim_outbox("d1", 5, lease)


def batches_with_bad_numbers(run: Run) -> dict[str, Batch]:
    def b(**kw: Any) -> Batch:
        return Batch(run.id, run.lease_epoch, "w1", **kw)

    def s(**kw: Any) -> Step:
        fields: dict[str, Any] = {"step_no": 1, "kind": "tool", "name": "t", "status": "ok"}
        fields.update(kw)
        return Step(run_id=run.id, lease_epoch=run.lease_epoch, **fields)

    approval = {
        "id": "a",
        "run_id": run.id,
        "step_no": 1,
        "tool": "t",
        "arguments": {},
        "required_role": "r",
        "requested_at": 1.0,
        "expires_at": 2.0,
        "default_decision": "reject",
    }
    return {
        "run cost NaN": b(run=RunUpdate(cost_usd=NAN)),
        "active seconds inf": b(run=RunUpdate(active_seconds=INF)),
        "park until NaN": b(run=RunUpdate(status="waiting", available_at=NAN)),
        "park until inf": b(run=RunUpdate(status="waiting", available_at=INF)),
        "result NaN": b(run=RunUpdate(status="completed", result={"x": NAN})),
        "step cost NaN": b(steps=[s(cost_usd=NAN)]),
        "step duration inf": b(steps=[s(duration_ms=INF)]),
        "step output NaN": b(steps=[s(output=[NAN])]),
        "step no 2**70": b(steps=[s(step_no=2**70)]),
        "approval expiry inf": b(approvals=[Approval(**{**approval, "expires_at": INF})]),
        "approval args NaN": b(approvals=[Approval(**{**approval, "arguments": {"a": NAN}})]),
        "outbox due NaN": b(
            outbox=[
                OutboxItem(
                    key="o", run_id=run.id, step_no=1, tool="t", payload={}, next_attempt_at=NAN
                )
            ]
        ),
        "outbox payload inf": b(
            outbox=[OutboxItem(key="o", run_id=run.id, step_no=1, tool="t", payload={"a": INF})]
        ),
        "effect step 2**70": b(
            effects=[Effect(key="e", run_id=run.id, step_no=2**70, status="claimed")]
        ),
        "event data NaN": b(events=[NewEvent("e", "w1", {"x": NAN})]),
    }


async def test_a_batch_with_a_number_no_column_can_hold_fails_alone_and_writes_nothing(
    store: Store,
) -> None:
    run = await claimed(store)
    before = (await store.get_run(run.id), await store.list_events(run.id))
    for label, bad in batches_with_bad_numbers(run).items():
        with pytest.raises(UnstorableBatch):
            await store.commit(bad)
            pytest.fail(label)
    assert (await store.get_run(run.id), await store.list_events(run.id)) == before
    assert await store.load_journal(run.id) == []
    assert await store.list_outbox() == [] and await store.get_approvals() == []


async def test_outbox_settle_refuses_a_due_time_that_never_comes(store: Store) -> None:
    run = await claimed(store)
    item = OutboxItem(key="m", run_id=run.id, step_no=1, tool="email", payload={})
    await store.commit(Batch(run.id, run.lease_epoch, "w1", outbox=[item]))
    (got,) = await store.claim_outbox("d1", 5, 30)
    for due in (NAN, INF):
        got.next_attempt_at = due
        with pytest.raises(UnstorableValue):
            await store.settle_outbox(got)
    (row,) = await store.list_outbox()
    assert math.isfinite(row.next_attempt_at) and row.attempts == 0


async def test_errors_never_echo_unprintable_text(store: Store) -> None:
    for call in (store.cancel_run(BAD, "r", "a"), store.decide_approval(BAD, "approve", "a")):
        with pytest.raises(StoreError) as caught:
            await call
        str(caught.value).encode("utf-8")  # printable: no lone surrogate, no NUL
        assert "\x00" not in str(caught.value)
