"""Resume and the steps a person or a queue stands behind (issue 19, second review,
points 2 and 3): an approval given for some arguments never covers others after a
resume, and an email already enqueued (or delivered) is never enqueued again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, ToolContext
from agentledger.errors import BusinessError
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import Harness

STATE: dict[str, Any] = {}


def _app() -> App:
    app = App("approval-outbox")

    @app.tool(effect="money", idempotency="provider", approval="manager")
    async def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
        STATE["paid"].append((ctx.idempotency_key, amount))
        if STATE["decline"]:
            raise BusinessError("card declined")  # an answer: nothing applied
        return {"paid": amount}

    @app.tool(effect="notify", delivery="outbox")
    async def send_email(ctx: ToolContext, text: str) -> dict[str, Any]:
        return {"sent": text}

    @app.workflow(name="approved")
    async def approved(ctx: Any, input: Any) -> Any:
        await ctx.step("prep", lambda: "ready")
        return await ctx.tool("pay", amount=STATE["amount"])

    @app.workflow(name="mailed")
    async def mailed(ctx: Any, input: Any) -> Any:
        await ctx.tool("send_email", text="booked")

        def confirm() -> str:
            if STATE["bug"]:
                raise RuntimeError("confirm: bug")
            return "ok"

        return await ctx.step("confirm", confirm)

    return app


@pytest.fixture
def harness(tmp_path: Path, store_url: str) -> Harness:
    STATE.update(paid=[], decline=False, amount=100, bug=False)
    return Harness(tmp_path, _app(), url=store_url)


@pytest.mark.parametrize("from_step", [None, 1, 2])
async def test_an_approval_never_covers_other_arguments_after_a_resume(
    harness: Harness, from_step: int | None
) -> None:
    async with harness as h:
        STATE["decline"] = True
        run_id = await h.submit("approved")
        await h.execute(run_id)
        (asked,) = await h.store.get_approvals(run_id)
        await h.store.decide_approval(asked.id, "approve", "boss", clock=h.clock)
        assert (await h.drive(run_id)).status == RunStatus.FAILED
        STATE.update(decline=False, amount=9999)  # the code now proposes another amount
        await h.store.transact(
            observe_resume.resume_run, run_id, from_step, "ops:amy", "card fixed"
        )
        await h.execute(run_id)
        run = await h.run(run_id)
        assert run.status == RunStatus.WAITING, run  # asked again, not paid
        assert [amount for _, amount in STATE["paid"]] == [100]
        (again,) = await h.store.get_approvals(run_id)
        assert again.id != asked.id and again.arguments == {"amount": 9999}
        assert again.decision is None


async def test_an_enqueued_email_is_never_enqueued_again(harness: Harness) -> None:
    async with harness as h:
        STATE["bug"] = True
        run_id = await h.submit("mailed")
        assert (await h.drive(run_id)).status == RunStatus.FAILED
        (queued,) = await h.store.list_outbox(None)
        STATE["bug"] = False
        with pytest.raises(ResumeRefused, match="was executed"):
            await h.store.transact(observe_resume.resume_run, run_id, 1, "ops:amy", "again")
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "bug fixed")
        assert (await h.drive(run_id)).status == RunStatus.COMPLETED
        assert [o.key for o in await h.store.list_outbox(None)] == [queued.key]
