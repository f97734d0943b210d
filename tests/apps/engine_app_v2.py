"""The same workflow at version 2 only: a worker of this app cannot resume version 1."""

from __future__ import annotations

from typing import Any

from agentledger import App, WorkflowContext
from tests.apps.engine_app import keyed_write

app = App("engine-tests-v2")
app.add_tool(keyed_write)


@app.workflow(name="versioned", version="2")
async def versioned_v2(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    await ctx.tool("keyed_write", item="v2")
    return {"version": "2"}
