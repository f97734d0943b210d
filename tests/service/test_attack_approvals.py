"""Hostile deciders: a cancelled run's approval, another guest's run, forged hashes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.service.conftest import Api, in_process, settings_for, until
from tests.service.test_approvals_api import parked
from tests.service.test_runs_api import assert_problem


@pytest.fixture
async def live(tmp_path) -> AsyncIterator[Api]:  # type: ignore[no-untyped-def]
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'a.db'}", workers_inline=1)) as a:
        yield a


async def test_a_cancelled_runs_approval_cannot_be_approved(live: Api) -> None:
    guest = await live.key("t1", "gina", ("guest",))
    run = await parked(live, guest, {"role": "guest"})
    shown = run["pending_approval"]
    listed = (await live.client.get("/v1/approvals", headers=guest)).json()["approvals"]
    ahash = listed[0]["arguments_hash"]
    r = await live.client.post(f"/v1/runs/{run['id']}/cancel", headers=guest)
    assert r.status_code in (200, 202), r.text

    async def ended() -> bool:
        got = await live.client.get(f"/v1/runs/{run['id']}", headers=guest)
        return bool(got.json()["status"] in ("cancelled", "failed", "completed"))

    await until(ended)
    r = await live.client.post(
        f"/v1/approvals/{shown['id']}/decision",
        json={"decision": "approve", "arguments_hash": ahash},
        headers=guest,
    )
    assert r.status_code in (409, 410), r.text
    final = (await live.client.get(f"/v1/runs/{run['id']}", headers=guest)).json()
    assert final["status"] == "cancelled", final
    listed = (await live.client.get("/v1/approvals", headers=guest)).json()["approvals"]
    assert listed == []


async def test_a_guest_cannot_decide_another_guests_run(live: Api) -> None:
    gina = await live.key("t1", "gina", ("guest",))
    greg = await live.key("t1", "greg", ("guest",))
    run = await parked(live, gina, {"role": "guest"})
    approval_id = run["pending_approval"]["id"]
    assert (await live.client.get("/v1/approvals", headers=greg)).json()["approvals"] == []
    listed = (await live.client.get("/v1/approvals", headers=gina)).json()["approvals"]
    body = {"decision": "approve", "arguments_hash": listed[0]["arguments_hash"]}
    url = f"/v1/approvals/{approval_id}/decision"
    assert_problem(await live.client.post(url, json=body, headers=greg), 403, "forbidden")
    # The run's own user, with a key lacking the role the policy named: 403.
    for roles in (("viewer",), ("operator",), ("manager",)):
        other = await live.key("t1", "gina", roles)
        assert_problem(await live.client.post(url, json=body, headers=other), 403, "forbidden")
    # The owner's client retries the decision 8 times at once: each retry answers the
    # one decision (200, idempotent), and the audit trail records ONE decision and ONE
    # decision context, not one per retry.
    many = await asyncio.gather(*[live.client.post(url, json=body, headers=gina) for _ in range(8)])
    assert [r.status_code for r in many] == [200] * 8, [r.text for r in many]
    assert_problem(
        await live.client.post(url, json={**body, "decision": "reject"}, headers=gina),
        409, "already-decided",
    )  # fmt: skip
    await live.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=gina)
    events = await live.client.get(
        f"/v1/runs/{run['id']}/events", params={"format": "json", "limit": 1000}, headers=gina
    )
    types = [e["type"] for e in events.json()["events"]]
    assert types.count("approval.decided") == 1, types
    assert types.count("approval.decision_context") == 1, types


async def test_a_decision_sent_again_after_it_committed_answers_200_once(live: Api) -> None:
    """A client whose first decision committed (its reply lost, say) sends it again: the
    same decider's same decision is answered with the recorded one, not 409, and the
    audit trail keeps one decision; another decision is still a conflict."""
    gina = await live.key("t1", "gina", ("guest",))
    run = await parked(live, gina, {"role": "guest"})
    approval_id = run["pending_approval"]["id"]
    listed = (await live.client.get("/v1/approvals", headers=gina)).json()["approvals"]
    body = {"decision": "approve", "arguments_hash": listed[0]["arguments_hash"]}
    url = f"/v1/approvals/{approval_id}/decision"
    first = await live.client.post(url, json=body, headers=gina)
    again = await live.client.post(url, json=body, headers=gina)
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert again.json()["decided_by"] == "gina" and again.json()["decision"] == "approve"
    assert_problem(
        await live.client.post(url, json={**body, "decision": "reject"}, headers=gina),
        409, "already-decided",
    )  # fmt: skip
    events = await live.client.get(
        f"/v1/runs/{run['id']}/events", params={"format": "json", "limit": 1000}, headers=gina
    )
    types = [e["type"] for e in events.json()["events"]]
    assert types.count("approval.decided") == 1, types
    assert types.count("approval.decision_context") == 1, types
