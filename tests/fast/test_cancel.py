"""The cancel protocol, engine side (issue item 5): a cancel request is honoured at the
next step boundary, after every in-flight step is resolved, then compensations run
and the run ends ``cancelled``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentledger import App, RunStatus, Status, ToolContext
from agentledger.tools._contract import Compensation
from tests.fast.lifecycle_harness import KILLED, Harness, Killed


class World:
    def __init__(self) -> None:
        self.charges: dict[str, Any] = {}
        self.refunds: dict[str, Any] = {}
        self.calls: list[str] = []
        self.on_charge: Any = None
        self.after_charge: list[str] = []


def make_app(w: World) -> App:
    app = App("cancel")

    async def status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        w.calls.append(f"check:{ctx.idempotency_key}")
        done = w.charges.get(ctx.idempotency_key)
        return Status.succeeded(done) if done else Status.not_found()

    @app.tool(effect="money", idempotency="provider")
    async def refund(ctx: ToolContext, payment_id: str) -> dict[str, Any]:
        w.calls.append("refund")
        w.refunds[payment_id] = True
        return {"refunded": payment_id}

    @app.tool(
        effect="money",
        idempotency="provider",
        status_check=status,
        compensation=Compensation("refund", lambda a, r: {"payment_id": r["payment_id"]}),
    )
    async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
        w.calls.append("charge")
        result = {"payment_id": f"pay_{amount}"}
        w.charges[ctx.idempotency_key] = result
        if w.on_charge is not None:
            hook, w.on_charge = w.on_charge, None
            hook(ctx)
        return result

    @app.workflow(name="pay_and_sleep")
    async def pay_and_sleep(ctx: Any, input: Any) -> Any:
        await ctx.tool("charge", amount=40)
        w.after_charge.append("next step reached")
        await ctx.sleep(3600)
        await ctx.step("after", lambda: "late")
        return "done"

    return app


async def test_a_cancel_during_a_write_journals_it_then_compensates(tmp_path: Path) -> None:
    w = World()
    async with Harness(tmp_path, make_app(w)) as h:
        run_id = await h.submit("pay_and_sleep")
        # The worker's heartbeat learns of the cancel while the charge is in flight.
        w.on_charge = lambda ctx: h.cancels.__setitem__(run_id, "guest changed their mind")
        assert await h.execute(run_id) == RunStatus.CANCELLED
        run = await h.run(run_id)
        journal = await h.journal(run_id)
        events = [e.type for e in await h.events(run_id)]
    assert run.status == RunStatus.CANCELLED
    assert "guest changed their mind" in (run.error or "")
    assert [(s.kind, s.name, s.status) for s in journal] == [
        ("tool", "charge", "succeeded"),
        ("decision", "compensate", "succeeded"),
        ("compensation", "refund", "succeeded"),
    ]
    assert journal[1].output["status"] == RunStatus.CANCELLED
    assert w.calls == ["charge", "refund"]  # the sleep after the charge never began
    assert "run.cancelled" in events


async def test_a_cancel_found_at_claim_runs_nothing_new(tmp_path: Path) -> None:
    w = World()
    async with Harness(tmp_path, make_app(w)) as h:
        run_id = await h.submit("pay_and_sleep")
        assert await h.execute(run_id, cancel_requested="duplicate") == RunStatus.CANCELLED
        assert await h.journal(run_id) == []
    assert w.calls == []


async def test_a_cancel_ends_a_durable_sleep_and_compensates(tmp_path: Path) -> None:
    w = World()
    async with Harness(tmp_path, make_app(w)) as h:
        run_id = await h.submit("pay_and_sleep")
        assert await h.execute(run_id) == RunStatus.WAITING
        assert await h.execute(run_id, cancel_requested="too slow") == RunStatus.CANCELLED
        journal = await h.journal(run_id)
    assert [s.kind for s in journal] == ["tool", "sleep", "decision", "compensation"]
    assert w.refunds == {"pay_40": True}


async def test_a_cancel_after_a_kill_mid_write_resolves_the_write_first(tmp_path: Path) -> None:
    w = World()

    def die(ctx: ToolContext) -> None:
        raise Killed()

    w.on_charge = die
    async with Harness(tmp_path, make_app(w)) as h:
        run_id = await h.submit("pay_and_sleep")
        assert await h.execute(run_id) == KILLED
        h.cancels[run_id] = "cancelled by support"
        assert await h.execute(run_id) == RunStatus.CANCELLED
        journal = await h.journal(run_id)
    key = journal[0].idempotency_key
    assert w.calls == ["charge", f"check:{key}", "refund"]
    assert journal[0].status == "succeeded"
