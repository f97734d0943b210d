"""A resume that undoes a compensation decision gives back what the decision dropped:
the outbox rows the run's kept steps enqueued are delivered again, not lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, RunStatus, Status, ToolContext
from agentledger.errors import BusinessError
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.tools._contract import Compensation
from tests.fast.lifecycle_harness import Harness


def _app(state: dict[str, Any]) -> App:
    app = App("resume-outbox")
    charges: dict[str, Any] = {}

    async def charge_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        done = charges.get(ctx.idempotency_key)
        return Status.succeeded(done) if done else Status.not_found()

    @app.tool(effect="money", idempotency="provider", timeout=1)
    async def refund(ctx: ToolContext, payment_id: str) -> dict[str, Any]:
        raise BusinessError("refund declined")

    @app.tool(
        effect="money",
        idempotency="provider",
        status_check=charge_status,
        compensation=Compensation("refund", lambda args, result: {"payment_id": result["id"]}),
    )
    async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
        return charges.setdefault(ctx.idempotency_key, {"id": "pay_1", "amount": amount})

    @app.tool(effect="notify", delivery="outbox")
    async def send_email(ctx: ToolContext, text: str) -> dict[str, Any]:
        return {"sent": text}

    @app.workflow(name="book")
    async def book(ctx: Any, input: Any) -> Any:
        await ctx.tool("charge", amount=40)
        await ctx.tool("send_email", text="booking confirmed")
        if state["bug"]:
            raise RuntimeError("bug after the email was decided")
        return "booked"

    return app


async def test_a_resume_past_the_decision_revives_the_dropped_outbox(tmp_path: Path) -> None:
    state = {"bug": True}
    async with Harness(tmp_path, _app(state)) as h:
        run_id = await h.submit("book")
        run = await h.drive(run_id)
        # The bug failed the run; the decision dropped the email; the refund was declined.
        assert run.status == RunStatus.NEEDS_HUMAN, run
        (row,) = await h.store.list_outbox()
        assert row.status == "dropped"
        state["bug"] = False  # the fix is deployed
        plan = await h.store.transact(
            observe_resume.resume_run, run_id, None, "ops:alice", "bug fixed"
        )
        assert plan.from_step == 3  # the decision and the declined refund go
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED, run
        # The run completed having enqueued the email: it must be delivered.
        (row,) = await h.store.list_outbox()
        assert row.status == "pending", row


async def test_a_decided_outbox_step_is_not_deleted_by_a_resume(tmp_path: Path) -> None:
    state = {"bug": True}
    async with Harness(tmp_path, _app(state)) as h:
        run_id = await h.submit("book")
        assert (await h.drive(run_id)).status == RunStatus.NEEDS_HUMAN
        state["bug"] = False
        before = [(s.step_no, s.status) for s in await h.journal(run_id)]
        # From the email step itself: a decided effect the journal keeps.
        with pytest.raises(ResumeRefused, match=r"step 2 .*was executed"):
            await h.store.transact(
                observe_resume.resume_run, run_id, 2, "ops:alice", "send it after all"
            )
        assert [(s.step_no, s.status) for s in await h.journal(run_id)] == before
        (row,) = await h.store.list_outbox()
        assert row.status == "dropped", row
