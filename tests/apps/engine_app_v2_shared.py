"""Version 2 of ``versioned`` plus the same version 1 of ``quick`` the old app has: a
deploy where only one workflow changed (the drain tests)."""

from __future__ import annotations

from typing import Any

from agentledger import App, WorkflowContext
from tests.apps.engine_app import keyed_write, read_tool

app = App("engine-tests-v2-shared")
app.add_tool(keyed_write)
app.add_tool(read_tool)


@app.workflow(name="versioned", version="2")
async def versioned_v2(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    await ctx.tool("keyed_write", item="v2")
    return {"version": "2"}


@app.workflow(name="quick", version="1")
async def quick(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    await ctx.tool("read_tool", x=str(input["n"]))
    await ctx.tool("keyed_write", item=f"q{input['n']}")
    return {"n": input["n"]}
