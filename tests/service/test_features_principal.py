"""Tools receive the principal of the API key that started the run; no secret is journaled."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentledger import App, ToolContext, WorkflowContext
from agentledger.service._auth import create_key
from tests.service.conftest import PEPPER, in_process, settings_for, until

app = App("principal-tests")
seen: dict[str, Any] = {}


@app.tool(effect="read")
async def whoami(ctx: ToolContext, credential: str) -> dict[str, Any]:
    """Reports the principal it acts for; ``credential`` is a name, never a secret."""
    p = ctx.principal
    assert p is not None
    seen[ctx.run_id] = p
    return {"user": p.user_id, "roles": sorted(p.roles), "credential": credential}


@app.workflow(name="who", version="1")
async def who(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """One tool call, run with the caller's principal."""
    return await ctx.tool("whoami", credential="crm-readonly")


@contextlib.asynccontextmanager
async def service(url: str) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    async with in_process(settings_for(url, workers_inline=1), app) as api:
        yield api.app, api.client


async def test_a_tool_sees_the_principal_of_the_key_that_started_the_run(store_url: str) -> None:
    async with service(store_url) as (api, client):
        full, _ = await create_key(
            api.state.store, PEPPER, "t1", "gina", ["guest", "manager"], 3600
        )
        headers = {"Authorization": f"Bearer {full}"}
        run = (
            await client.post("/v1/runs", json={"agent": "who", "input": {}}, headers=headers)
        ).json()

        async def done() -> bool:
            r = (await client.get(f"/v1/runs/{run['id']}", headers=headers)).json()
            return bool(r["status"] == "completed")

        await until(done)
        p = seen[run["id"]]
        assert (p.tenant_id, p.user_id, p.roles) == ("t1", "gina", frozenset({"guest", "manager"}))
        assert p.key_id == full.split("_", 2)[1]
        # Nothing the run wrote holds the key's secret: not the journal, not the events.
        secret = full.split("_", 2)[2]
        steps = (await client.get(f"/v1/runs/{run['id']}/steps", headers=headers)).text
        events = await api.state.store.list_events(run["id"])
        assert "crm-readonly" in steps
        assert secret not in steps and secret not in repr(events)
        stored = await api.state.store.get_run(run["id"])
        assert stored.principal["user_id"] == "gina" and secret not in repr(stored)
