"""The policy and approval gate (engine/_approvals.py; issue items 17 and 20)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, RunStatus, ToolContext
from agentledger._clock import FakeClock
from agentledger._policies import Allow, Deny, ProposedCall, RequireApproval
from agentledger.engine._runner import Stopped
from agentledger.errors import Refused, StoreError
from agentledger.store._queries.approvals import ApprovalExpired
from tests.fast.lifecycle_harness import Harness


def make_app(calls: list[str]) -> App:
    app = App("gate")

    def policy(call: ProposedCall) -> Any:
        if call.tool == "wire":
            return Deny("wires are not allowed")
        if call.tool == "book" and call.arguments.get("vip"):
            return RequireApproval(role="manager", expires_in=600, default="approve")
        return Allow()

    @app.tool(effect="write", idempotency="provider", approval="guest")
    async def book(ctx: ToolContext, hotel: str, vip: bool = False) -> dict[str, Any]:
        calls.append(f"book:{hotel}")
        return {"booked": hotel}

    @app.tool(effect="money", idempotency="provider")
    async def wire(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.append("wire")
        return {"wired": amount}

    @app.workflow(name="book_it", policy=policy)
    async def book_it(ctx: Any, input: Any) -> Any:
        try:
            return await ctx.tool("book", hotel="h1", vip=input.get("vip", False))
        except Refused as exc:
            return {"refused": str(exc)}

    @app.workflow(name="wire_it", policy=policy)
    async def wire_it(ctx: Any, input: Any) -> Any:
        try:
            return await ctx.tool("wire", amount=5)
        except Refused as exc:
            return {"refused": type(exc).__name__, "message": str(exc)}

    return app


async def _pending(h: Harness, run_id: str) -> Any:
    (approval,) = await h.store.get_approvals(run_id)
    assert approval.decision is None
    return approval


async def test_deny_is_journaled_as_not_allowed(tmp_path: Path) -> None:
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        run = await h.drive(await h.submit("wire_it"))
        (step,) = await h.journal(run.id)
        events = [e for e in await h.events(run.id) if e.type == "policy.decision"]
    assert calls == []
    assert (step.status, step.error_class) == ("failed", "not_allowed")
    assert run.result == {"refused": "Refused", "message": "wires are not allowed"}
    assert events and events[0].data["decision"] == "Deny"


async def test_an_approved_call_runs_once(tmp_path: Path) -> None:
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        run_id = await h.submit("book_it")
        assert await h.execute(run_id) == RunStatus.WAITING
        assert await h.execute(run_id) == RunStatus.WAITING  # still pending: parks again
        approval = await _pending(h, run_id)
        assert approval.required_role == "guest"
        # A tool's ``approval=`` role: the defaults, 24 h then rejected.
        assert approval.expires_at - approval.requested_at == 24 * 3600
        assert approval.default_decision == "reject"
        await h.store.decide_approval(approval.id, "approve", "guest:ann", h.clock)
        run = await h.drive(run_id)
    assert run.status == RunStatus.COMPLETED and run.result == {"booked": "h1"}
    assert calls == ["book:h1"]


async def test_a_rejected_call_is_told_to_the_workflow(tmp_path: Path) -> None:
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        run_id = await h.submit("book_it")
        await h.execute(run_id)
        pending = await _pending(h, run_id)
        await h.store.decide_approval(pending.id, "reject", "guest:ann", h.clock)
        run = await h.drive(run_id)
    assert calls == []
    assert run.result == {"refused": "book was rejected by guest:ann"}


async def test_expiry_applies_the_default(tmp_path: Path) -> None:
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        run_id = await h.submit("book_it", {"vip": True})
        await h.execute(run_id)
        approval = await _pending(h, run_id)
        assert approval.required_role == "manager"
        h.clock.advance(601)
        run = await h.drive(run_id)
        (decided,) = await h.store.get_approvals(run_id)
    assert (decided.decision, decided.decided_by) == ("approve", "system:expired")
    assert run.status == RunStatus.COMPLETED and calls == ["book:h1"]


class LateDecider:
    """A store whose human decision lands just before the worker's expiry default (on
    the human's clock, a millisecond before ``expires_at``)."""

    def __init__(self, h: Harness, decision: str) -> None:
        self.original = h.store.decide_approval
        self.decision = decision

        async def decide(
            approval_id: str, decision: str, decided_by: str, clock: Any = None
        ) -> Any:
            if decided_by.startswith("system:"):
                (a,) = [a for a in await h.store.get_approvals() if a.id == approval_id]
                just_before = FakeClock(start=a.expires_at - 0.001)
                await self.original(approval_id, self.decision, "manager:bo", just_before)
                raise StoreError(f"approval {approval_id} was already decided by manager:bo")
            return await self.original(approval_id, decision, decided_by, clock)

        h.store.decide_approval = decide  # type: ignore[method-assign]


async def test_a_human_decision_at_expiry_time_wins_approve(tmp_path: Path) -> None:
    """Item 20: the engine reads the winner's decision instead of failing the run."""
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        LateDecider(h, "approve")
        run_id = await h.submit("book_it")  # default on expiry: reject
        await h.execute(run_id)
        h.clock.advance(24 * 3600 + 1)
        assert await h.execute(run_id) == RunStatus.COMPLETED  # in this pass, not a retry
        run = await h.run(run_id)
        (decided,) = await h.store.get_approvals(run_id)
    assert run.status == RunStatus.COMPLETED, run
    assert (decided.decision, decided.decided_by) == ("approve", "manager:bo")
    assert calls == ["book:h1"]


async def test_a_human_decision_made_at_expiry_loses_to_the_default(tmp_path: Path) -> None:
    """On the decider's clock the approval has expired: nothing is recorded, and the
    worker applies the default (reject) as if nobody had decided."""
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        run_id = await h.submit("book_it")  # default on expiry: reject
        await h.execute(run_id)
        approval = await _pending(h, run_id)
        at_expiry = FakeClock(start=approval.expires_at)
        with pytest.raises(ApprovalExpired):
            await h.store.decide_approval(approval.id, "approve", "guest:ann", at_expiry)
        h.clock.advance(24 * 3600 + 1)
        run = await h.drive(run_id)
        (decided,) = await h.store.get_approvals(run_id)
    assert (decided.decision, decided.decided_by) == ("reject", "system:expired")
    assert calls == [] and run.result == {"refused": "book was rejected by system:expired"}


async def test_a_human_decision_at_expiry_time_wins_reject(tmp_path: Path) -> None:
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        LateDecider(h, "reject")
        run_id = await h.submit("book_it", {"vip": True})  # default on expiry: approve
        await h.execute(run_id)
        h.clock.advance(601)
        assert await h.execute(run_id) == RunStatus.COMPLETED
        run = await h.run(run_id)
    assert run.status == RunStatus.COMPLETED and calls == []
    assert run.result == {"refused": "book was rejected by manager:bo"}


async def test_a_store_failure_while_deciding_leaves_the_run_for_resume(tmp_path: Path) -> None:
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        run_id = await h.submit("book_it")
        await h.execute(run_id)
        h.clock.advance(24 * 3600 + 1)
        original = h.store.decide_approval

        async def broken(*args: Any) -> Any:
            raise StoreError("database is locked")

        h.store.decide_approval = broken  # type: ignore[method-assign]
        assert await h.execute(run_id) == Stopped.ABANDONED
        assert not (await h.run(run_id)).terminal
        h.store.decide_approval = original  # type: ignore[method-assign]
        run = await h.drive(run_id)
    assert run.status == RunStatus.COMPLETED
    assert run.result == {"refused": "book was rejected by system:expired"}


async def test_a_cancel_while_waiting_for_approval_closes_it(tmp_path: Path) -> None:
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        run_id = await h.submit("book_it")
        await h.execute(run_id)
        assert await h.execute(run_id, cancel_requested="guest left") == RunStatus.CANCELLED
        (approval,) = await h.store.get_approvals(run_id)
        (step,) = await h.journal(run_id)
    assert (approval.decision, approval.decided_by) == ("reject", "system:cancelled")
    assert step.status == "failed" and calls == []


async def test_a_cancel_loses_to_an_approval_already_given(tmp_path: Path) -> None:
    """The human approved first: the approved call is a step in flight; it runs, then the
    run stops at the next boundary."""
    calls: list[str] = []
    async with Harness(tmp_path, make_app(calls)) as h:
        LateDecider(h, "approve")
        run_id = await h.submit("book_it")
        await h.execute(run_id)
        h.cancels[run_id] = "guest left"
        outcome = await h.execute(run_id)
        (step,) = await h.journal(run_id)
    assert step.status == "succeeded" and calls == ["book:h1"]
    assert outcome == RunStatus.COMPLETED  # the workflow had no step after it
