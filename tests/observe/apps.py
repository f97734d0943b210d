"""A small booking workflow for the observability tests: a read, a payment (a keyed
write with a status check) and a confirmation step whose bug an env flag switches on."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from agentledger import App, Status, ToolContext
from agentledger.tools._contract import RetryPolicy, tool
from tests.fast.lifecycle_harness import Killed

BUG_FLAG = "AGENTLEDGER_TEST_CONFIRM_BUG"


@dataclass
class Payments:
    """A provider that dedupes keys; ``kill_after_apply`` kills the worker mid-call."""

    charges: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    kill_after_apply: bool = False

    async def pay(self, ctx: ToolContext, amount: int) -> dict[str, Any]:
        self.calls.append(ctx.idempotency_key)
        charge = self.charges.setdefault(
            ctx.idempotency_key, {"id": f"ch_{len(self.charges) + 1}", "amount": amount}
        )
        if self.kill_after_apply:
            self.kill_after_apply = False
            raise Killed("worker killed mid-payment")
        return charge

    async def status(self, ctx: ToolContext, args: dict[str, Any]) -> Status:
        found = self.charges.get(ctx.idempotency_key)
        return Status.succeeded(found) if found else Status.not_found()


def booking_app(payments: Payments, *, approval: bool = False) -> App:
    app = App("observe")

    @app.tool(timeout=2.0)
    async def search(ctx: ToolContext, city: str) -> dict[str, Any]:
        return {"hotel": f"{city}-1"}

    pay = tool(
        payments.pay,
        name="pay",
        effect="write",
        idempotency="provider",
        status_check=payments.status,
        timeout=5.0,
        retry=RetryPolicy(base_delay=0.01),
        approval="guest" if approval else None,
    )
    app.add_tool(pay)

    @app.workflow(name="booking")
    async def booking(ctx: Any, input: Any) -> Any:
        hotel = await ctx.tool("search", city="Paris")
        charge = await ctx.tool("pay", amount=120)

        def confirm() -> dict[str, Any]:
            if os.environ.get(BUG_FLAG) == "1":
                raise RuntimeError("confirm: bug in the confirmation code")
            return {"confirmed": hotel["hotel"], "charge": charge["id"]}

        return await ctx.step("confirm", confirm)

    return app


def booking_agent_app(payments: Payments) -> App:
    """The booking as an agent: the model asks for a search, then the payment, then
    answers; ``payments.kill_after_apply`` kills the worker during the payment."""
    from agentledger import Agent, ScriptedModel, Turn

    app = booking_app(payments)
    model = ScriptedModel(
        [
            Turn(calls=[("search", {"city": "Paris"})]),
            Turn(calls=[("pay", {"amount": 120})]),
            Turn(text="Booked."),
        ],
        name="scripted-booker",
    )
    tools = [app.tools["search"], app.tools["pay"]]
    app.add_agent(Agent(name="booker", model=model, instructions="Book.", tools=tools))
    return app


def journal_app() -> App:
    """A workflow of plain ``ctx.step`` calls; the second one kills the worker once."""
    app = App("observe-steps")
    state = {"kill": True}

    @app.workflow(name="steps")
    async def steps(ctx: Any, input: Any) -> Any:
        first = await ctx.step("first", lambda: 1)

        def second() -> int:
            if state["kill"]:
                state["kill"] = False
                raise Killed("worker killed in the second step")
            return 2

        return {"sum": first + await ctx.step("second", second)}

    return app
