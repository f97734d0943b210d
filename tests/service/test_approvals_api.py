"""Approvals by role through the API, with a worker running in the service process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentledger.service._routers import approvals as approvals_router
from tests.service.conftest import Api, in_process, pending_in_time, settings_for, until
from tests.service.test_runs_api import assert_problem


@pytest.fixture
async def live(store_url: str) -> AsyncIterator[Api]:
    """The service with one inline worker, on each backend."""
    async with in_process(settings_for(store_url, workers_inline=1)) as api:
        yield api


async def parked(api: Api, headers: dict[str, str], approval: dict[str, Any]) -> dict[str, Any]:
    body = {"agent": "payout", "input": {"amount": 120, "approval": approval}}
    run = (await api.client.post("/v1/runs", json=body, headers=headers)).json()

    async def waiting() -> bool:
        r = (await api.client.get(f"/v1/runs/{run['id']}", headers=headers)).json()
        return bool(r["pending_approval"]) and r["status"] == "waiting"

    await until(waiting)
    return dict((await api.client.get(f"/v1/runs/{run['id']}", headers=headers)).json())


async def test_a_manager_approves_through_the_api_and_the_run_completes(live: Api) -> None:
    guest = await live.key("t1", "gina", ("guest",))
    manager = await live.key("t1", "mona", ("manager",))
    other_manager = await live.key("t1", "max", ("manager",))
    operator = await live.key("t1", "olga", ("operator",))
    foreign = await live.key("t2", "fred", ("manager", "admin"))
    run = await parked(live, guest, {"role": "manager"})
    approval_id = run["pending_approval"]["id"]
    listed = (await live.client.get("/v1/approvals", headers=manager)).json()["approvals"]
    assert [a["id"] for a in listed] == [approval_id]
    shown = listed[0]
    assert shown["arguments"] == {"amount": 120} and shown["required_role"] == "manager"
    assert (await live.client.get("/v1/approvals", headers=operator)).json()["approvals"] == []
    # The built-in approver and admin roles may decide any role's approval of the tenant.
    for role in ("approver", "admin"):
        anyone = await live.key("t1", f"{role}-user", (role,))
        seen = (await live.client.get("/v1/approvals", headers=anyone)).json()["approvals"]
        assert [a["id"] for a in seen] == [approval_id]
    assert (await live.client.get("/v1/approvals", headers=foreign)).json()["approvals"] == []
    decision = {"decision": "approve", "arguments_hash": shown["arguments_hash"]}
    url = f"/v1/approvals/{approval_id}/decision"
    assert_problem(await live.client.post(url, json=decision, headers=operator), 403, "forbidden")
    assert_problem(await live.client.post(url, json=decision, headers=foreign), 404, "not-found")
    wrong = {**decision, "arguments_hash": "0" * 64}
    assert_problem(
        await live.client.post(url, json=wrong, headers=manager), 409, "arguments-changed"
    )
    # Two managers decide at once: exactly one wins.
    a, b = await asyncio.gather(
        live.client.post(url, json=decision, headers=manager),
        live.client.post(url, json={**decision, "decision": "reject"}, headers=other_manager),
    )
    assert sorted([a.status_code, b.status_code]) == [200, 409]
    loser = b if b.status_code == 409 else a
    assert_problem(loser, 409, "already-decided")
    assert loser.json()["decided_by"] in ("mona", "max")
    result = await live.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=guest)
    assert result.status_code == 200
    winner = "approve" if a.status_code == 200 else "reject"
    if winner == "approve":
        assert result.json()["status"] == "completed"
        assert result.json()["result"]["paid"] == 120


async def test_a_decision_after_expiry_is_410_and_the_default_applies(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'exp.db'}"
    async with in_process(settings_for(url, workers_inline=1)) as api:
        guest = await api.key("t1", "gina", ("guest",))

        async def start(ttl: float) -> str:
            ask = {"role": "guest", "expires_in": ttl}
            body = {"agent": "payout", "input": {"amount": 120, "approval": ask}}
            return str((await api.client.post("/v1/runs", json=body, headers=guest)).json()["id"])

        # The result below waits for the expiry itself (an approval expiring within the
        # wait is waited for).
        run = await pending_in_time(api, guest, start)
        shown = run["pending_approval"]
        body = {"decision": "approve", "arguments_hash": shown["arguments_hash"]}
        result = await api.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=guest)
        assert result.json()["status"] in ("failed", "completed")
        r = await api.client.post(f"/v1/approvals/{shown['id']}/decision", json=body, headers=guest)
        assert_problem(r, 410, "expired")
        steps = (await api.client.get(f"/v1/runs/{run['id']}/steps", headers=guest)).json()
        assert all(s["status"] != "succeeded" for s in steps["steps"] if s["name"] == "pay")


async def test_a_guest_approval_is_decided_by_the_runs_own_user(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'guest.db'}"
    async with in_process(settings_for(url, workers_inline=1)) as api:
        gina = await api.key("t1", "gina", ("guest",))
        other_guest = await api.key("t1", "gus", ("guest",))
        run = await parked(api, gina, {"role": "guest"})
        approval = (await api.client.get("/v1/approvals", headers=gina)).json()["approvals"][0]
        assert (await api.client.get("/v1/approvals", headers=other_guest)).json() == {
            "approvals": [],
            "next_cursor": None,
        }
        body = {"decision": "approve", "arguments_hash": approval["arguments_hash"]}
        url_ = f"/v1/approvals/{approval['id']}/decision"
        assert_problem(
            await api.client.post(url_, json=body, headers=other_guest), 403, "forbidden"
        )
        ok = await api.client.post(url_, json=body, headers=gina)
        assert ok.status_code == 200 and ok.json()["decided_by"] == "gina"
        done = await api.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=gina)
        assert done.json()["status"] == "completed" and done.json()["result"]["paid"] == 120


async def test_execution_refuses_arguments_that_differ_from_the_approved_ones(
    tmp_path: Path,
) -> None:
    """The approval row is edited after it was requested: the approver is shown (and
    approves) the edited arguments, but the journaled call differs, so it never runs."""
    url = f"sqlite:///{tmp_path / 'tamper.db'}"
    async with in_process(settings_for(url, workers_inline=1)) as api:
        gina = await api.key("t1", "gina", ("guest",))
        run = await parked(api, gina, {"role": "guest"})
        approval_id = run["pending_approval"]["id"]
        await api.store.transact(
            lambda tx: tx.execute(
                "UPDATE approvals SET arguments = :a WHERE id = :id",
                {"a": '{"amount": 1}', "id": approval_id},
            )
        )  # fmt: skip
        approval = (await api.client.get("/v1/approvals", headers=gina)).json()["approvals"][0]
        assert approval["arguments"] == {"amount": 1}
        body = {"decision": "approve", "arguments_hash": approval["arguments_hash"]}
        ok = await api.client.post(f"/v1/approvals/{approval_id}/decision", json=body, headers=gina)
        assert ok.status_code == 200
        done = await api.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=gina)
        assert done.json()["status"] == "failed"
        steps = (await api.client.get(f"/v1/runs/{run['id']}/steps", headers=gina)).json()
        pay = [s for s in steps["steps"] if s["name"] == "pay"]
        assert pay and pay[-1]["status"] == "failed" and "differ" in (pay[-1]["error"] or "")


async def test_the_list_shows_what_the_caller_may_decide_past_others_approvals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oldest approval needs a manager; a guest listing one approval still gets their
    own (the store is paged until the caller's are found), and the manager theirs."""
    monkeypatch.setattr(approvals_router, "_PAGE", 1)  # one approval per store read
    url = f"sqlite:///{tmp_path / 'page.db'}"
    async with in_process(settings_for(url, workers_inline=1)) as api:
        gina = await api.key("t1", "gina", ("guest",))
        mona = await api.key("t1", "mona", ("manager",))
        for_manager = await parked(api, gina, {"role": "manager"})
        for_guest = await parked(api, gina, {"role": "guest"})
        mine = (await api.client.get("/v1/approvals?limit=1", headers=gina)).json()
        assert [a["id"] for a in mine["approvals"]] == [for_guest["pending_approval"]["id"]]
        assert mine["approvals"][0]["arguments"] == {"amount": 120}
        theirs = (await api.client.get("/v1/approvals?limit=1", headers=mona)).json()
        assert [a["id"] for a in theirs["approvals"]] == [for_manager["pending_approval"]["id"]]
        # The next page goes on after it: nothing more for the manager.
        rest = await api.client.get(
            "/v1/approvals", params={"limit": 1, "cursor": theirs["next_cursor"]}, headers=mona
        )
        assert rest.json() == {"approvals": [], "next_cursor": None}
        # A scan that stops at its bound says where to go on.
        monkeypatch.setattr(approvals_router, "_MAX_PAGES", 1)
        first = (await api.client.get("/v1/approvals", headers=gina)).json()
        assert first["approvals"] == [] and first["next_cursor"]
        more = await api.client.get(
            "/v1/approvals", params={"cursor": first["next_cursor"]}, headers=gina
        )
        assert [a["id"] for a in more.json()["approvals"]] == [for_guest["pending_approval"]["id"]]
        for bad in ("zz", "W10", "WzEsICJcdTAwMDAiXQ"):
            assert_problem(
                await api.client.get(f"/v1/approvals?cursor={bad}", headers=gina),
                400, "bad-request",
            )  # fmt: skip


async def test_a_result_long_poll_on_a_run_parked_for_approval_answers_at_once(
    live: Api,
) -> None:
    """Nothing will finish a parked run but a person: ``result?wait=`` says so (202 with
    the pending approval) instead of holding the wait. Were it to wait, it would still be
    waiting (watching the run) when the approval is decided, and answer the result."""
    guest = await live.key("t1", "gina", ("guest",))
    manager = await live.key("t1", "mona", ("manager",))
    run = await parked(live, guest, {"role": "manager"})
    hub = live.app.state.hub
    waiting = asyncio.create_task(
        live.client.get(f"/v1/runs/{run['id']}/result?wait=60", headers=guest)
    )

    async def answered_or_held() -> bool:
        return waiting.done() or ("run", run["id"]) in hub._waiters

    await until(answered_or_held)
    approval = run["pending_approval"]
    decision = {"decision": "approve", "arguments_hash": approval["arguments_hash"]}
    url = f"/v1/approvals/{approval['id']}/decision"
    assert (await live.client.post(url, json=decision, headers=manager)).status_code == 200
    answer = await waiting
    assert answer.status_code == 202, answer.text
    assert answer.headers["retry-after"] == "1"
    body = answer.json()
    assert body["status"] == "waiting" and body["pending_approval"]["id"] == approval["id"]
