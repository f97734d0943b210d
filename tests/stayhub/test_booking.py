"""The StayHub agent against the sandbox over real HTTP, on real worker processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from agentledger_examples.stayhub.sandbox.catalog import GUEST_EMAIL_DOMAIN
from agentledger_examples.stayhub.script import INVENTED_ADDRESS

from .conftest import StackFactory

pytestmark = pytest.mark.slow


def kinds(effects: list[dict]) -> list[str]:
    return sorted(str(e["kind"]) for e in effects)


async def test_normal_booking(stayhub: StackFactory) -> None:
    async with stayhub() as stack:
        run_id = await stack.submit()
        run = await stack.wait(run_id)
        assert run.status == "completed", run.error
        assert "Booked" in run.result["answer"]
        await stack.drain()
        assert kinds(stack.ledger(run_id)) == ["booking", "charge"]
        approvals = await stack.store.get_approvals(run_id)
        # The guest approves the booking, then the payment with its server-computed amount.
        assert [(a.tool, a.decided_by) for a in approvals] == [
            ("create_booking", "guest:g-123"),
            ("create_payment", "guest:g-123"),
        ]
        assert approvals[1].arguments["amount"]["amount"] > 0, approvals[1].arguments
        assert stack.invariants()["ok"]
        assert stack.invariants()["emails"] == 1


async def test_kill_worker_mid_payment(stayhub: StackFactory) -> None:
    async with stayhub(faults="payments.create:hold,hold=5") as stack:
        run_id = await stack.submit()
        deadline = time.monotonic() + 20
        payment = None
        while time.monotonic() < deadline:
            steps = {s.name: s for s in await stack.journal(run_id)}
            payment = steps.get("create_payment")
            if payment is not None and payment.status == "started":
                break
            await asyncio.sleep(0.05)
        assert payment is not None and payment.status == "started", stack.logs()
        started_epoch = payment.lease_epoch
        run = await stack.store.get_run(run_id)
        assert run is not None and run.lease_owner is not None
        pid = int(run.lease_owner.split(":")[1])
        victim = next(p for p in stack.pool.procs if p.pid == pid)
        stack.pool.kill(victim)  # SIGKILL while the provider holds the payment request
        assert victim.returncode == -signal.SIGKILL

        run = await stack.wait(run_id)
        assert run.status == "completed", run.error
        assert run.resumes >= 1
        ledger = stack.ledger(run_id)
        assert kinds(ledger) == ["booking", "charge"]  # exactly one of each
        journal = {s.name: s for s in await stack.journal(run_id)}
        assert journal["create_payment"].status == "succeeded"
        # Resumed by another worker under a later epoch (more than one if it parked while
        # the provider still said "pending").
        assert journal["create_payment"].lease_epoch > started_epoch
        # The booking was written before the payment's approval parked the run.
        assert journal["create_booking"].lease_epoch < started_epoch
        events = [e.type for e in await stack.events(run_id)]
        assert "tool.resumed_unknown" in events
        # Resolved by asking the provider: found (status_resolved), or not found and sent
        # again with the same key (executed on a later attempt) -- both charge once.
        assert "tool.status_resolved" in events or "tool.executed" in events, events
        assert stack.invariants()["ok"]


@pytest.mark.parametrize(
    ("endpoint", "tool", "env"),
    [
        ("payments.create", "create_payment", "STAYHUB_PAYMENT_TIMEOUT"),
        ("bookings.create", "create_booking", "STAYHUB_BOOKING_TIMEOUT"),
    ],
)
async def test_timeout_after_commit(
    stayhub: StackFactory, endpoint: str, tool: str, env: str
) -> None:
    faults = f"{endpoint}:timeout_after_commit,hold=15,count=1"
    async with stayhub(faults=faults, env={env: "1.5"}) as stack:
        run_id = await stack.submit()
        run = await stack.wait(run_id)
        assert run.status == "completed", run.error
        assert kinds(stack.ledger(run_id)) == ["booking", "charge"]  # no second effect
        step = next(s for s in await stack.journal(run_id) if s.name == tool)
        assert step.status == "succeeded" and step.attempts == 1
        events = await stack.events(run_id)
        assert any(e.type == "tool.unknown_outcome" and e.data["tool"] == tool for e in events)
        assert any(e.type == "tool.status_resolved" and e.data["tool"] == tool for e in events)
        assert stack.invariants()["ok"]


async def test_email_outage_run_completes_email_delivered_later(stayhub: StackFactory) -> None:
    # The outage lasts until the test ends it: after the run completed and the email's
    # first delivery failed, whatever the machine's speed (a timed outage either ends
    # before the run does or outlasts the outbox's attempts).
    async with stayhub(faults="email:outage") as stack:
        run_id = await stack.submit()
        run = await stack.wait(run_id)
        assert run.status == "completed", run.error
        ledger = stack.ledger()
        assert [e["kind"] for e in ledger if e["kind"] == "charge"] == ["charge"]  # paid
        assert not [e for e in ledger if e["kind"] == "email"]  # not yet
        emails = [i for i in await stack.store.list_outbox() if i.tool == "send_email"]
        assert len(emails) == 1 and emails[0].status == "pending"
        for _ in range(200):
            email = next(i for i in await stack.store.list_outbox() if i.tool == "send_email")
            if email.attempts >= 1:
                break
            await asyncio.sleep(0.05)
        assert email.status == "pending" and email.attempts >= 1, email
        stack.sandbox.set_faults("")  # the provider is back
        counts = await stack.drain(timeout=45)
        assert counts.get("delivered") == 2 and not counts.get("dead"), counts
        email = next(i for i in await stack.store.list_outbox() if i.tool == "send_email")
        assert email.attempts > 1  # failed during the outage, delivered after it
        booking = next(e for e in ledger if e["kind"] == "booking")
        sent = [e for e in stack.ledger() if e["kind"] == "email"]
        assert len(sent) == 1 and sent[0]["booking_id"] == booking["booking_id"]
        assert stack.invariants()["duplicate_emails"] == 0


async def test_rate_limit_storm_on_search_backs_off(stayhub: StackFactory) -> None:
    async with stayhub(faults="search:rate_limit@1,retry_after=1,count=2") as stack:
        run_id = await stack.submit()
        run = await stack.wait(run_id)
        assert run.status == "completed", run.error
        search = next(s for s in await stack.journal(run_id) if s.name == "search_hotels")
        assert search.status == "succeeded" and search.attempts == 3
        assert (search.duration_ms or 0) >= 1900  # Retry-After: 1 honoured twice


async def test_search_5xx_two_retries_then_failure_path(stayhub: StackFactory) -> None:
    async with stayhub(faults="search:error,count=3") as stack:
        run_id = await stack.submit()
        run = await stack.wait(run_id)
        search = next(s for s in await stack.journal(run_id) if s.name == "search_hotels")
        assert search.status == "failed" and search.attempts == 3  # 1 call + 2 retries
        assert search.error_class == "provider_error"
        # The model was told and gave up: no booking, no charge.
        assert run.status == "completed"
        assert "search_hotels failed" in run.result["answer"]
        assert stack.ledger(run_id) == []


async def test_injected_server_args_are_overridden(stayhub: StackFactory) -> None:
    async with stayhub() as stack:
        run_id = await stack.submit(script="inject_amount")
        run = await stack.wait(run_id)
        assert run.status == "completed", run.error
        await stack.drain()
        ledger = stack.ledger()
        booking = next(e for e in ledger if e["kind"] == "booking")
        charge = next(e for e in ledger if e["kind"] == "charge")
        assert charge["amount"] == booking["amount"] != 1  # the server's price
        email = next(e for e in ledger if e["kind"] == "email")
        assert email["recipient"] == f"g-123@{GUEST_EMAIL_DOMAIN}" != INVENTED_ADDRESS
        steps = {s.name: s for s in await stack.journal(run_id)}
        assert steps["create_payment"].input["ignored_model_args"] == {"amount": 1}
        assert steps["send_email"].input["ignored_model_args"] == {"to": INVENTED_ADDRESS}
        overridden = [
            e.data["tool"]
            for e in await stack.events(run_id)
            if e.type == "tool.server_args_overridden"
        ]
        assert sorted(overridden) == ["create_payment", "send_email"]


async def test_looping_model_stops_at_budget_and_booking_is_cancelled(
    stayhub: StackFactory,
) -> None:
    async with stayhub() as stack:
        run_id = await stack.submit(script="loop")
        run = await stack.wait(run_id)
        assert run.status == "needs_human"
        assert "step budget" in (run.handover_reason or "")
        ledger = stack.ledger()
        booking = next(e for e in ledger if e["kind"] == "booking")
        cancels = [e for e in ledger if e["kind"] == "booking_cancel"]
        assert [c["booking_id"] for c in cancels] == [booking["booking_id"]]  # no orphan hold
        journal = await stack.journal(run_id)
        comp = [s for s in journal if s.kind == "compensation"]
        assert [(s.name, s.status) for s in comp] == [("cancel_booking", "succeeded")]
        assert not [e for e in ledger if e["kind"] == "charge"]
        assert stack.invariants()["ok"]


async def test_budget_hit_after_payment_refunds_and_cancels(stayhub: StackFactory) -> None:
    async with stayhub() as stack:
        run_id = await stack.submit(script="loop_after_payment")
        run = await stack.wait(run_id)
        assert run.status == "needs_human"
        assert "step budget" in (run.handover_reason or "")
        # The charge the failed run leaves behind is refunded, then the booking cancelled.
        assert sorted(kinds(stack.ledger(run_id))) == [
            "booking",
            "booking_cancel",
            "charge",
            "refund",
        ]
        journal = await stack.journal(run_id)
        comp = [(s.name, s.status) for s in journal if s.kind == "compensation"]
        assert comp == [("refund_payment", "succeeded"), ("cancel_booking", "succeeded")]
        invariants = stack.invariants()
        assert invariants["ok"] and invariants["orphan_charges"] == 0


async def test_declined_payment_cancels_the_booking(stayhub: StackFactory) -> None:
    async with stayhub(faults="payments.create:decline") as stack:
        run_id = await stack.submit()
        run = await stack.wait(run_id)
        assert run.status == "completed"
        assert "declined" in run.result["answer"]
        assert kinds(stack.ledger(run_id)) == ["booking", "booking_cancel"]
        assert stack.invariants()["ok"]


async def test_env_is_not_leaking(stayhub: StackFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack's ``env`` reaches its worker processes and never the test process,
    where it would change every later test (the app reads it at import)."""
    name = "STAYHUB_PAYMENT_TIMEOUT"
    monkeypatch.delenv(name, raising=False)
    if not os.path.exists(f"/proc/{os.getpid()}/environ"):
        pytest.skip("needs /proc to read a worker's environment")
    async with stayhub(env={name: "7.5"}) as stack:
        # A process that has exited shows an empty environ: read the live ones.
        alive = stack.pool.alive()
        assert alive, stack.logs()
        for proc in alive:
            # An empty environ means "not readable yet" (a child still between fork and
            # exec under load) or "exited": read again until it shows, while alive.
            environ = b""
            deadline = time.monotonic() + 20
            while not environ and proc.poll() is None and time.monotonic() < deadline:
                with open(f"/proc/{proc.pid}/environ", "rb") as f:
                    environ = f.read()
                if not environ:
                    await asyncio.sleep(0.05)
            if proc.poll() is None:  # still alive after the read
                assert f"{name}=7.5".encode() in environ.split(b"\0"), stack.logs()
        assert name not in os.environ
    assert name not in os.environ
