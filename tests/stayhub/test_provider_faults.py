"""The engine against providers as strict as the real ones, on real worker processes:
answers lost or replaced by a 5xx after the provider applied the write, requests held
past the tool timeout (409 in progress on retry), key-less providers."""

from __future__ import annotations

import asyncio
import time

import pytest

from .conftest import Stack, StackFactory

pytestmark = pytest.mark.slow


def kinds(effects: list[dict]) -> list[str]:
    return sorted(str(e["kind"]) for e in effects)


async def settled_outbox(stack: Stack, tool: str, timeout: float) -> str:
    """Wait until the tool's outbox row is delivered or dead; return its status."""
    deadline = time.monotonic() + timeout
    status = "missing"
    while time.monotonic() < deadline:
        rows = [i for i in await stack.store.list_outbox() if i.tool == tool]
        status = rows[0].status if rows else "missing"
        if status in ("delivered", "dead"):
            return status
        await asyncio.sleep(0.1)
    return status


async def test_charge_answered_500_after_commit_is_status_checked(stayhub: StackFactory) -> None:
    """Stripe's 500 is indeterminate and replayed for the key: the engine must ask the
    status by key, find the charge, and go on with the booking standing."""
    async with stayhub(faults="payments.create:error_after_commit,status=500,save=1,count=1") as s:
        run_id = await s.submit()
        run = await s.wait(run_id)
        await s.drain()
        ledger = s.ledger(run_id)
        assert kinds(ledger) == ["booking", "charge"], (run.result, s.invariants()["violations"])
        assert run.status == "completed" and "Booked" in run.result["answer"], run.result
        step = next(x for x in await s.journal(run_id) if x.name == "create_payment")
        assert step.status == "succeeded"
        assert (
            step.output["payment_id"]
            == next(e for e in ledger if e["kind"] == "charge")["payment_id"]
        )
        events = [(e.type, e.data.get("tool")) for e in await s.events(run_id)]
        assert ("tool.status_resolved", "create_payment") in events
        assert s.invariants()["ok"], s.invariants()["violations"]
        assert s.sandbox.fault_stats()["dropped"] == {"payments.create": 1}


async def test_lost_decline_is_found_failed_by_the_status_check(stayhub: StackFactory) -> None:
    faults = "payments.create:decline,count=1;payments.create:timeout_after_commit,hold=4,count=1"
    async with stayhub(faults=faults, env={"STAYHUB_PAYMENT_TIMEOUT": "1.5"}) as s:
        run_id = await s.submit()
        run = await s.wait(run_id)
        assert run.status == "completed" and "declined" in run.result["answer"], run.result
        assert kinds(s.ledger(run_id)) == ["booking", "booking_cancel"]
        step = next(x for x in await s.journal(run_id) if x.name == "create_payment")
        assert step.status == "failed" and "card_declined" in (step.error or "")
        assert s.invariants()["ok"], s.invariants()["violations"]


async def test_refund_held_past_the_timeout_is_applied_once(stayhub: StackFactory) -> None:
    """The guest cancels; the refund is held past the tool timeout, so the next request
    with its key meets 409 in progress: wait and check, never a failure."""
    faults = "payments.refund:hold,hold=4,count=1"
    async with stayhub(faults=faults, env={"STAYHUB_BOOKING_TIMEOUT": "1.5"}) as s:
        run_id = await s.submit(script="guest_cancels")
        run = await s.wait(run_id, timeout=60)
        assert kinds(s.ledger(run_id)) == ["booking", "booking_cancel", "charge", "refund"]
        assert run.status == "completed" and "refunded" in run.result["answer"], run.result
        refund = next(x for x in await s.journal(run_id) if x.name == "refund_payment")
        assert refund.status == "succeeded" and refund.output["status"] == "succeeded"
        assert s.invariants()["ok"], s.invariants()["violations"]


async def test_email_held_past_the_timeout_is_delivered_once(stayhub: StackFactory) -> None:
    faults = "email:hold,hold=4,count=1"
    async with stayhub(faults=faults, env={"STAYHUB_NOTIFY_TIMEOUT": "1.5"}) as s:
        run_id = await s.submit()
        run = await s.wait(run_id)
        assert run.status == "completed", run.error
        assert await settled_outbox(s, "send_email", 60) == "delivered"
        emails = [e for e in s.ledger() if e["kind"] == "email"]
        assert len(emails) == 1
        assert s.invariants()["ok"], s.invariants()["violations"]


async def test_keyless_email_with_a_lost_answer_is_never_sent_twice(
    stayhub: StackFactory,
) -> None:
    """A mail service without idempotency keys: once its answer is lost, nobody can tell
    whether the email went out. Sent once (the effects table) or handed to a human (a dead
    outbox row), never twice."""
    faults = "email:keyless;email:timeout_after_commit,hold=4,count=1"
    # A short outbox backoff: the status checks that find nothing run in seconds, not in
    # the minutes of the default exponential backoff; the path taken is the same.
    env = {"STAYHUB_NOTIFY_TIMEOUT": "1.5", "AGENTLEDGER_OUTBOX_BASE_DELAY": "0.02"}
    async with stayhub(faults=faults, env=env) as s:
        run_id = await s.submit()
        run = await s.wait(run_id)
        assert run.status == "completed", run.error
        status = await settled_outbox(s, "send_email", 60)
        emails = [e for e in s.ledger() if e["kind"] == "email"]
        assert len(emails) == 1, f"{len(emails)} emails sent; outbox row {status}"
        assert status in ("delivered", "dead")
        assert s.invariants()["duplicate_emails"] == 0


async def test_keyless_crm_409_updates_the_existing_contact(stayhub: StackFactory) -> None:
    async with stayhub(faults="crm:keyless") as s:
        first = await s.submit()
        await s.wait(first)
        second = await s.submit(city="Porto", check_in="2026-11-02")  # same guest again
        await s.wait(second)
        counts = await s.drain()
        assert counts.get("delivered") == 4 and not counts.get("dead"), counts
        crm = [(e["run_id"], e["booking_id"]) for e in s.ledger() if e["kind"] == "crm"]
        bookings = {e["run_id"]: e["booking_id"] for e in s.ledger() if e["kind"] == "booking"}
        # Each run's booking reaches the CRM once. The outbox promises no order between
        # runs: a delivery that timed out on a loaded machine is retried after the next.
        assert sorted(crm) == sorted([(first, bookings[first]), (second, bookings[second])])
        assert s.invariants()["ok"], s.invariants()["violations"]
