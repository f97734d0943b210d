"""An agent whose charge is killed in flight exactly at its step budget (for
tests/engine/test_lifecycle_kill.py)."""

from __future__ import annotations

from typing import Any

from agentledger import Agent, App, ScriptedModel, ToolContext, Turn
from agentledger._budget import Budget
from agentledger.tools._contract import Compensation
from tests.apps import ledger
from tests.apps.engine_app import hold, ledger_status

app = App("lifecycle-kill")


@app.tool(effect="money", timeout=5, idempotency="provider", status_check=ledger_status)
async def krefund(ctx: ToolContext, payment: str) -> dict[str, Any]:
    """Refund a charge."""
    return ledger.apply(ctx.idempotency_key, "krefund", dedupe=True, payload=payment)


@app.tool(
    effect="money",
    timeout=30,
    idempotency="provider",
    status_check=ledger_status,
    compensation=Compensation("krefund", lambda args, result: {"payment": result["key"]}),
)
async def kcharge(ctx: ToolContext, order: str, flag: str) -> dict[str, Any]:
    """Charge, then hold while ``flag`` exists (the test kills the worker there)."""
    result = ledger.apply(ctx.idempotency_key, "kcharge", dedupe=True, payload=order)
    await hold(flag)
    return result


def _turn(request: Any) -> Turn:
    flag = request.metadata["input"]["flag"]
    return Turn(calls=[("kcharge", {"order": "o1", "flag": flag})])


app.add_agent(
    Agent(
        name="charge_at_limit",
        model=ScriptedModel(_turn),
        instructions="charge",
        tools=[kcharge, krefund],
        budget=Budget(max_steps=2),
    )
)
