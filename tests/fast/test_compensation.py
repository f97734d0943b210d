"""Compensations are durable steps (issue items 2, 4, 9): they park and resume,
are status-checked, and what cannot be settled hands the run to a human."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import Agent, App, RunStatus, ScriptedModel, Status, ToolContext, Turn
from agentledger._budget import Budget
from agentledger.errors import BusinessError, RateLimited
from agentledger.tools._contract import Compensation
from tests.fast.lifecycle_harness import KILLED, Harness, Killed


class Provider:
    """A payment provider with keys, a status endpoint and scripted refund faults."""

    def __init__(self, refund_faults: list[str] | None = None) -> None:
        self.charges: dict[str, dict[str, Any]] = {}
        self.refunds: dict[str, dict[str, Any]] = {}
        self.refund_calls = 0
        self.charge_calls = 0
        self.checks: list[str] = []
        self.refund_faults = list(refund_faults or [])
        self.kill_charge = False
        self.workflow_passes = 0


def make_app(p: Provider, *, bad_args: bool = False) -> App:
    app = App("comp")

    async def charge_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        p.checks.append(ctx.idempotency_key)
        done = p.charges.get(ctx.idempotency_key)
        return Status.succeeded(done) if done else Status.not_found()

    async def refund_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        p.checks.append(ctx.idempotency_key)
        if p.refund_faults and p.refund_faults[0] == "pending_forever":
            return Status.pending()
        done = p.refunds.get(ctx.idempotency_key)
        return Status.succeeded(done) if done else Status.not_found()

    @app.tool(effect="money", idempotency="provider", status_check=refund_status, timeout=1)
    async def refund(ctx: ToolContext, payment_id: str) -> dict[str, Any]:
        p.refund_calls += 1
        fault = p.refund_faults.pop(0) if p.refund_faults else None
        if fault == "429":
            raise RateLimited("slow down", retry_after=60)
        if fault == "declined":
            raise BusinessError("refund declined")
        if fault in ("unknown", "pending_forever"):
            p.refunds[ctx.idempotency_key] = {"refunded": payment_id}
            if fault == "pending_forever":
                p.refund_faults.insert(0, fault)
            raise ConnectionResetError("reset after the provider applied it")
        p.refunds[ctx.idempotency_key] = {"refunded": payment_id}
        return {"refunded": payment_id}

    def refund_args(args: dict[str, Any], result: Any) -> dict[str, Any]:
        if bad_args:
            raise KeyError("payment_id")
        return {"payment_id": result["payment_id"]}

    @app.tool(
        effect="money",
        idempotency="provider",
        status_check=charge_status,
        compensation=Compensation("refund", refund_args),
    )
    async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
        p.charge_calls += 1
        result = {"payment_id": f"pay_{len(p.charges) + 1}", "amount": amount}
        p.charges[ctx.idempotency_key] = result
        if p.kill_charge:
            p.kill_charge = False
            raise Killed()
        return result

    @app.tool(effect="notify", delivery="outbox")
    async def send_email(ctx: ToolContext, text: str) -> dict[str, Any]:
        return {"sent": text}

    @app.workflow(name="pay_then_fail")
    async def pay_then_fail(ctx: Any, input: Any) -> Any:
        p.workflow_passes += 1
        await ctx.tool("charge", amount=40)
        await ctx.tool("send_email", text="booking confirmed")
        raise RuntimeError("the hotel went away")

    @app.workflow(name="two_charges_then_fail")
    async def two_charges_then_fail(ctx: Any, input: Any) -> Any:
        p.workflow_passes += 1
        await ctx.tool("charge", amount=10)
        await ctx.tool("charge", amount=20)
        raise RuntimeError("no room after all")

    app.add_agent(
        Agent(
            name="charger",
            model=ScriptedModel([Turn(calls=[("charge", {"amount": 40})])] * 5),
            instructions="charge",
            tools=[charge],
            budget=Budget(max_steps=2),
        )
    )
    return app


async def _fail_and_compensate(tmp_path: Path, p: Provider, **kw: Any) -> Any:
    async with Harness(tmp_path, make_app(p, **kw)) as h:
        run = await h.drive(await h.submit("pay_then_fail"))
        return run, await h.journal(run.id), h


async def test_a_plain_failure_refunds_and_fails(tmp_path: Path) -> None:
    p = Provider()
    run, journal, _h = await _fail_and_compensate(tmp_path, p)
    assert run.status == RunStatus.FAILED and "hotel went away" in (run.error or "")
    assert [(s.kind, s.name, s.status) for s in journal] == [
        ("tool", "charge", "succeeded"),
        ("tool", "send_email", "succeeded"),
        ("decision", "compensate", "succeeded"),
        ("compensation", "refund", "succeeded"),
    ]
    assert journal[2].output["status"] == RunStatus.FAILED
    assert journal[2].output["plan"] == [[1, 4]]
    assert p.refund_calls == 1


async def test_compensation_begins_by_dropping_the_undelivered_outbox(tmp_path: Path) -> None:
    """Item 9 (engine part): the decision's batch carries drop_outbox, before any refund."""
    p = Provider()
    run, _, h = await _fail_and_compensate(tmp_path, p)
    mine = [b for b in h.batches if b.run_id == run.id]
    dropping = [i for i, b in enumerate(mine) if b.drop_outbox]
    refund = [i for i, b in enumerate(mine) if any(s.kind == "compensation" for s in b.steps)]
    assert len(dropping) == 1
    assert [s.kind for s in mine[dropping[0]].steps] == ["decision"]
    assert dropping[0] < refund[0]


async def test_a_refund_answered_429_parks_and_resumes(tmp_path: Path) -> None:
    """Item 4: Retry-After 60 parks the compensation; the resumed run goes on refunding."""
    p = Provider(refund_faults=["429"])
    async with Harness(tmp_path, make_app(p)) as h:
        run_id = await h.submit("pay_then_fail")
        assert await h.execute(run_id) == RunStatus.WAITING
        assert (await h.run(run_id)).status == RunStatus.WAITING
        run = await h.drive(run_id)
        journal = await h.journal(run_id)
    assert run.status == RunStatus.FAILED
    assert p.refund_calls == 2 and len(p.refunds) == 1
    assert journal[-1].kind == "compensation" and journal[-1].status == "succeeded"
    assert p.workflow_passes == 1  # the resumed run went straight back to compensating


async def test_an_unknown_refund_is_status_checked(tmp_path: Path) -> None:
    p = Provider(refund_faults=["unknown"])
    run, journal, _ = await _fail_and_compensate(tmp_path, p)
    assert run.status == RunStatus.FAILED
    assert p.refund_calls == 1 and len(p.refunds) == 1
    assert journal[-1].status == "succeeded" and journal[-1].output == {"refunded": "pay_1"}


async def test_a_refund_that_stays_unknown_ends_needs_human(tmp_path: Path) -> None:
    p = Provider(refund_faults=["pending_forever"])
    run, _journal, _ = await _fail_and_compensate(tmp_path, p)
    assert run.status == RunStatus.NEEDS_HUMAN
    assert "compensation could not be settled" in (run.handover_reason or "")
    assert "refund for step 1 (charge)" in (run.handover_reason or "")
    assert "hotel went away" in (run.handover_reason or "")
    assert p.refund_calls == 1


async def test_a_declined_refund_ends_needs_human_not_failed(tmp_path: Path) -> None:
    p = Provider(refund_faults=["declined"])
    run, journal, _ = await _fail_and_compensate(tmp_path, p)
    assert run.status == RunStatus.NEEDS_HUMAN
    assert "refund declined" in (run.handover_reason or "")
    assert journal[-1].status == "failed"


async def test_compensation_arguments_that_cannot_be_built_hand_over(tmp_path: Path) -> None:
    """Item 4: no crash loop; the reason is on the run and in the journal."""
    p = Provider()
    run, journal, _h = await _fail_and_compensate(tmp_path, p, bad_args=True)
    assert run.status == RunStatus.NEEDS_HUMAN and run.resumes == 0
    assert "could not build its arguments: KeyError" in (run.handover_reason or "")
    assert (journal[-1].kind, journal[-1].status) == ("compensation", "failed")
    assert p.refund_calls == 0


async def test_a_compensating_run_resumed_after_a_kill_only_compensates(tmp_path: Path) -> None:
    p = Provider(refund_faults=["429"])
    async with Harness(tmp_path, make_app(p)) as h:
        run_id = await h.submit("pay_then_fail")
        assert await h.execute(run_id) == RunStatus.WAITING
        p.refund_faults = ["declined"]
        assert await h.execute(run_id) == RunStatus.NEEDS_HUMAN
        run = await h.run(run_id)
    assert p.workflow_passes == 1
    assert "heading to failed" in (run.handover_reason or "")


async def test_killed_mid_charge_at_max_steps_resolves_then_refunds(tmp_path: Path) -> None:
    """Item 2: the in-flight charge is status-checked before the budget is enforced."""
    p = Provider()
    p.kill_charge = True
    async with Harness(tmp_path, make_app(p)) as h:
        run_id = await h.submit("charger", {"message": "charge me"})
        assert await h.execute(run_id) == KILLED
        assert (await h.run(run_id)).step_count == 2  # exactly at max_steps
        run = await h.drive(run_id)
        journal = await h.journal(run_id)
    assert run.status == RunStatus.NEEDS_HUMAN
    assert "step budget" in (run.handover_reason or "")
    assert p.checks[0] == journal[1].idempotency_key  # the charge was checked, not left
    assert p.charge_calls == 1
    assert [(s.kind, s.status) for s in journal[1:]] == [
        ("tool", "succeeded"),
        ("decision", "succeeded"),
        ("compensation", "succeeded"),
    ]
    assert len(p.refunds) == 1


@pytest.mark.parametrize(
    ("newest", "end"), [(None, RunStatus.FAILED), ("declined", RunStatus.NEEDS_HUMAN)]
)
async def test_a_resumed_compensation_skips_what_is_settled(
    tmp_path: Path, newest: str | None, end: str
) -> None:
    """Newest first: the second refund parks (429); on resume the first refund's journal
    entry stands (done, or failed for good) and only the second one runs again."""
    p = Provider(refund_faults=[newest or "ok", "429"])
    async with Harness(tmp_path, make_app(p)) as h:
        run_id = await h.submit("two_charges_then_fail")
        assert await h.execute(run_id) == RunStatus.WAITING
        calls_before = p.refund_calls
        run = await h.drive(run_id)
        journal = await h.journal(run_id)
    assert run.status == end
    assert p.refund_calls == calls_before + 1 and p.workflow_passes == 1
    comps = [(s.input["compensates"], s.status) for s in journal if s.kind == "compensation"]
    assert comps == [(2, "failed" if newest else "succeeded"), (1, "succeeded")]
