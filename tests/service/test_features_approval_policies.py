"""Approval policies: the approver may not be the requester; two approvers above a threshold."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentledger import Allow, App, RequireApproval, ToolContext, WorkflowContext
from agentledger._policies import ProposedCall
from agentledger.service._auth import create_key
from tests.service.conftest import PEPPER, in_process, settings_for, until
from tests.service.test_runs_api import assert_problem

app = App("approval-policy-tests")
THRESHOLD = 1000


@app.tool(effect="write", idempotency="effects")
async def transfer(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """A transfer (at most once per key)."""
    return {"sent": amount}


def policy(call: ProposedCall) -> Any:
    """Four eyes always; two distinct managers above the threshold."""
    if call.tool != "transfer":
        return Allow()
    amount = int(call.arguments["amount"])
    return RequireApproval(
        "manager", not_requester=True, approvals_needed=2 if amount > THRESHOLD else 1
    )


@app.workflow(name="transfer", version="1", policy=policy)
async def transfer_flow(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """One transfer behind the policy."""
    return await ctx.tool("transfer", amount=int(input["amount"]))


@contextlib.asynccontextmanager
async def service(url: str) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    async with in_process(settings_for(url, workers_inline=1), app) as api:
        yield api.app, api.client


async def key(api: Any, user: str, *roles: str) -> dict[str, str]:
    full, _ = await create_key(api.state.store, PEPPER, "t1", user, list(roles), 3600)
    return {"Authorization": f"Bearer {full}"}


async def parked(client: httpx.AsyncClient, headers: dict[str, str], amount: int) -> dict[str, Any]:
    body = {"agent": "transfer", "input": {"amount": amount}}
    run = (await client.post("/v1/runs", json=body, headers=headers)).json()

    async def waiting() -> bool:
        r = (await client.get(f"/v1/runs/{run['id']}", headers=headers)).json()
        return bool(r["pending_approval"]) and r["status"] == "waiting"

    await until(waiting)
    return dict((await client.get(f"/v1/runs/{run['id']}", headers=headers)).json())


async def finished(client: httpx.AsyncClient, run_id: str, headers: dict[str, str]) -> Any:
    r = await client.get(f"/v1/runs/{run_id}/result?wait=30", headers=headers)
    assert r.status_code == 200
    return r.json()


def decision_for(listed: list[dict[str, Any]], approval_id: str, what: str) -> dict[str, Any]:
    shown = next(a for a in listed if a["id"] == approval_id)
    return {"decision": what, "arguments_hash": shown["arguments_hash"]}


async def test_the_requester_may_not_approve_their_own_run(store_url: str) -> None:
    async with service(store_url) as (api, client):
        mona = await key(api, "mona", "manager")
        max_ = await key(api, "max", "manager")
        run = await parked(client, mona, 50)
        approval_id = run["pending_approval"]["id"]
        # Listed to another manager, with the proposed action and its amount, but not to
        # the requester, who may not decide it.
        listed = (await client.get("/v1/approvals", headers=max_)).json()["approvals"]
        assert [(a["id"], a["tool"], a["arguments"]) for a in listed] == [
            (approval_id, "transfer", {"amount": 50})
        ]
        assert (await client.get("/v1/approvals", headers=mona)).json()["approvals"] == []
        url = f"/v1/approvals/{approval_id}/decision"
        body = decision_for(listed, approval_id, "approve")
        own = await client.post(url, json=body, headers=mona)
        assert_problem(own, 403, "forbidden")
        assert "started the run" in own.json()["detail"]
        # Rejecting one's own run is a decision too: refused the same way.
        refused = await client.post(url, json={**body, "decision": "reject"}, headers=mona)
        assert_problem(refused, 403, "forbidden")
        assert (await client.post(url, json=body, headers=max_)).status_code == 200
        done = await finished(client, run["id"], mona)
        assert done["status"] == "completed" and done["result"] == {"sent": 50}


async def test_above_the_threshold_two_distinct_approvers_are_needed(store_url: str) -> None:
    async with service(store_url) as (api, client):
        gina = await key(api, "gina", "guest")
        mona = await key(api, "mona", "manager")
        max_ = await key(api, "max", "manager")
        run = await parked(client, gina, 5000)
        approval_id = run["pending_approval"]["id"]
        listed = (await client.get("/v1/approvals", headers=mona)).json()["approvals"]
        url = f"/v1/approvals/{approval_id}/decision"
        body = decision_for(listed, approval_id, "approve")
        first = await client.post(url, json=body, headers=mona)
        assert first.status_code == 200
        assert first.json()["decision"] is None and first.json()["approvers"] == ["mona"]
        # The same approver again does not count twice.
        again = await client.post(url, json=body, headers=mona)
        assert again.status_code == 200 and again.json()["decision"] is None
        # Having approved, mona has nothing left to decide there; max still has.
        assert (await client.get("/v1/approvals", headers=mona)).json()["approvals"] == []
        still = (await client.get("/v1/approvals", headers=max_)).json()["approvals"]
        assert [(a["id"], a["approvers"]) for a in still] == [(approval_id, ["mona"])]
        state = (await client.get(f"/v1/runs/{run['id']}", headers=gina)).json()
        assert state["status"] == "waiting" and state["pending_approval"]["id"] == approval_id
        second = await client.post(url, json=body, headers=max_)
        assert second.status_code == 200 and second.json()["decision"] == "approve"
        assert second.json()["approvers"] == ["mona", "max"]
        done = await finished(client, run["id"], gina)
        assert done["status"] == "completed" and done["result"] == {"sent": 5000}
        # Below the threshold one approver decides.
        small = await parked(client, gina, 10)
        small_id = small["pending_approval"]["id"]
        listed = (await client.get("/v1/approvals", headers=mona)).json()["approvals"]
        one = await client.post(
            f"/v1/approvals/{small_id}/decision",
            json=decision_for(listed, small_id, "approve"),
            headers=mona,
        )
        assert one.json()["decision"] == "approve"
        assert (await finished(client, small["id"], gina))["status"] == "completed"
