"""A person's decision made at or after an approval's expiry is never recorded.

The store judges it in the statement that records the decision (and each approver's
vote), on the decider's clock (``FakeClock`` here), while it holds the approval's row;
the system's deciders (the expiry default, cancel) are not subject to it.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import psycopg
import pytest

from agentledger._clock import FakeClock
from agentledger.records import Approval, Run
from agentledger.service._queries import approvals as service_approvals
from agentledger.store import RunUpdate, Store
from agentledger.store._queries.approvals import ApprovalExpired
from tests.store.test_contract import batch, new_run

EXPIRES = 1_900_000_000.0  # on the engine's clock, as the gate writes it


async def parked(store: Store, approval_id: str, needed: int = 1, expires: float = EXPIRES) -> Run:
    """A run waiting for ``approval_id``, which expires at ``expires``."""
    await store.create_run(new_run(version=approval_id))
    (run,) = await store.claim_runs("w1", [f"agent@{approval_id}"], 1, 30)
    approval = Approval(
        id=approval_id,
        run_id=run.id,
        step_no=1,
        tool="refund",
        arguments={"amount": 5},
        required_role="manager",
        requested_at=expires - 600,
        expires_at=expires,
        default_decision="reject",
        approvals_needed=needed,
    )
    await store.commit(
        batch(run, approvals=[approval], run=RunUpdate(status="waiting", available_at=None))
    )
    return run


async def row(store: Store, approval_id: str) -> Approval:
    (found,) = [a for a in await store.get_approvals() if a.id == approval_id]
    return found


async def event_types(store: Store, run_id: str) -> list[str]:
    return [e.type for e in await store.list_events(run_id)]


async def test_a_decision_at_or_after_expiry_records_nothing_and_the_default_decides(
    store: Store,
) -> None:
    run = await parked(store, "ap1")
    before = await event_types(store, run.id)
    for late in (EXPIRES, EXPIRES + 0.001, EXPIRES + 3600):
        for decision in ("approve", "reject"):
            with pytest.raises(ApprovalExpired, match="expired"):
                await store.decide_approval("ap1", decision, "mona", FakeClock(late))
    a = await row(store, "ap1")
    assert (a.decision, a.decided_by, a.decided_at, a.approvers) == (None, None, None, [])
    assert await event_types(store, run.id) == before  # no approval.decided
    waiting = await store.get_run(run.id)
    assert waiting is not None and waiting.status == "waiting"  # not re-queued
    # The expiry default (a system decider) is recorded, after expiry as always.
    decided = await store.decide_approval("ap1", "reject", "system:expired")
    assert (decided.decision, decided.decided_by) == ("reject", "system:expired")


async def test_a_decision_before_expiry_is_recorded_and_its_retry_after_expiry_gets_it(
    store: Store,
) -> None:
    await parked(store, "ap1")
    first = await store.decide_approval("ap1", "approve", "mona", FakeClock(EXPIRES - 0.001))
    assert (first.decision, first.decided_by) == ("approve", "mona")
    # The same decision sent again (its reply was lost) after expiry: already recorded.
    again = await store.decide_approval("ap1", "approve", "mona", FakeClock(EXPIRES + 60))
    assert (again.decision, again.decided_by, again.decided_at) == (
        "approve",
        "mona",
        first.decided_at,
    )


async def test_each_approvers_vote_obeys_the_expiry(store: Store) -> None:
    run = await parked(store, "ap2", needed=2)
    # A first vote at expiry is refused (the vote's own UPDATE).
    with pytest.raises(ApprovalExpired):
        await store.decide_approval("ap2", "approve", "carl", FakeClock(EXPIRES))
    assert (await row(store, "ap2")).approvers == []
    voted = await store.decide_approval("ap2", "approve", "alma", FakeClock(EXPIRES - 1))
    assert voted.decision is None and voted.approvers == ["alma"]
    # The deciding (second) vote and a reject, both at expiry: refused.
    with pytest.raises(ApprovalExpired):
        await store.decide_approval("ap2", "approve", "bo", FakeClock(EXPIRES))
    with pytest.raises(ApprovalExpired):
        await store.decide_approval("ap2", "reject", "bo", FakeClock(EXPIRES + 1))
    a = await row(store, "ap2")
    assert (a.decision, a.approvers) == (None, ["alma"])
    assert (await event_types(store, run.id)).count("approval.approved_by") == 1
    decided = await store.decide_approval("ap2", "reject", "system:expired")
    assert (decided.decision, decided.decided_by) == ("reject", "system:expired")


async def test_the_service_path_obeys_the_expiry_and_writes_no_context(store: Store) -> None:
    run = await parked(store, "ap3")
    context = {"approval_id": "ap3", "key_id": "k1"}

    def decide(at: float) -> Any:
        return store.transact(
            service_approvals.decide_with_context, "ap3", "approve", "mona", context, FakeClock(at)
        )

    with pytest.raises(ApprovalExpired):
        await decide(EXPIRES)
    assert "approval.decision_context" not in await event_types(store, run.id)
    assert (await row(store, "ap3")).decision is None
    decided, first = await decide(EXPIRES - 0.001)
    assert first and (decided.decision, decided.decided_by) == ("approve", "mona")
    assert (await event_types(store, run.id)).count("approval.decision_context") == 1


class HeldRowClock(FakeClock):
    """A clock that, when read, checks from another connection that the approval's row
    is held (PostgreSQL: row lock; SQLite: the write lock)."""

    def __init__(self, url: str, approval_id: str, start: float) -> None:
        super().__init__(start)
        self.url, self.approval_id = url, approval_id
        self.held: list[bool] = []

    def now(self) -> float:
        self.held.append(self._row_is_held())
        return super().now()

    def _row_is_held(self) -> bool:
        if self.url.startswith("sqlite:"):
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=0)
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.rollback()
                return False
            except sqlite3.OperationalError:
                return True
            finally:
                conn.close()
        with psycopg.connect(self.url, autocommit=True) as conn:
            try:
                conn.execute(
                    "SELECT id FROM approvals WHERE id = %s FOR UPDATE NOWAIT",
                    (self.approval_id,),
                )
                return False
            except psycopg.errors.LockNotAvailable:
                return True


async def test_the_deciders_clock_is_read_while_the_row_is_held(
    store: Store, store_url: str
) -> None:
    """So the expiry default cannot commit between the reading and the guarded UPDATE:
    a decision is judged by when it holds the row, not by when it was sent."""
    await parked(store, "ap4")
    clock = HeldRowClock(store_url, "ap4", EXPIRES - 1)
    decided = await store.decide_approval("ap4", "approve", "mona", clock)
    assert decided.decision == "approve"
    assert clock.held == [True]


async def test_the_default_clock_is_the_real_one(store: Store) -> None:
    """A caller that passes no clock is judged on the real clock."""
    await parked(store, "ap5", expires=time.time() - 1)
    with pytest.raises(ApprovalExpired):
        await store.decide_approval("ap5", "approve", "mona")
    await parked(store, "ap6", expires=time.time() + 3600)
    assert (await store.decide_approval("ap6", "approve", "mona")).decision == "approve"
