"""The app of the upgrade tests: the engine tests' app plus an outbox delivery the test
holds while it upgrades the schema (a row claimed by a worker of the previous release)."""

from __future__ import annotations

from typing import Any

from agentledger import ToolContext, WorkflowContext
from tests.apps import ledger
from tests.apps.engine_app import app, hold

__all__ = ["app"]


@app.tool(effect="notify", delivery="outbox", timeout=60)
async def held_notify(ctx: ToolContext, msg: str, flag: str) -> dict[str, Any]:
    """Deliver a message, first holding while ``flag`` exists."""
    await hold(flag)
    return ledger.apply(ctx.idempotency_key, "held_notify", dedupe=False, payload=msg)


@app.workflow(name="held_notify_flow", version="1")
async def held_notify_flow(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return await ctx.tool("held_notify", msg=str(input["msg"]), flag=str(input["flag"]))
