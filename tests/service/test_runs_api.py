"""``/v1/runs`` through the ASGI app in process, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import Api, in_process, settings_for, until

PROBLEM = "application/problem+json"


def assert_problem(r, status: int, kind: str) -> dict:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["type"] == f"https://agentledger.dev/problems/{kind}"
    assert body["status"] == status and body["request_id"]
    return dict(body)


async def test_submit_answers_202_with_location_and_nothing_runs(api: Api) -> None:
    h = await api.key()
    r = await api.client.post(
        "/v1/runs", json={"agent": "echo", "input": {"text": "hi"}}, headers=h
    )
    assert r.status_code == 202, r.text
    run = r.json()
    assert r.headers["Location"] == f"/v1/runs/{run['id']}"
    assert r.headers["Retry-After"] == "1"
    assert run["status"] == "queued" and run["agent"] == "echo" and run["version"] == "1"
    assert run["principal"]["user_id"] == "alice" and run["principal"]["roles"] == ["operator"]
    got = await api.client.get(r.headers["Location"], headers=h)
    assert got.status_code == 200 and got.json()["status"] == "queued"
    assert got.json()["principal"]["key_id"] == run["principal"]["key_id"]
    pending = await api.client.get(f"/v1/runs/{run['id']}/result", headers=h)
    assert pending.status_code == 202 and pending.headers["Retry-After"] == "1"
    steps = await api.client.get(f"/v1/runs/{run['id']}/steps", headers=h)
    assert steps.status_code == 200 and steps.json()["steps"] == []


async def test_requests_without_a_valid_key_get_401_problem(api: Api) -> None:
    r = await api.client.get("/v1/runs")
    body = assert_problem(r, 401, "unauthenticated")
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert r.headers["X-Request-Id"] == body["request_id"]
    assert_problem(
        await api.client.get("/v1/runs", headers={"Authorization": "Bearer al_nope"}),
        401, "unauthenticated",
    )  # fmt: skip
    h = await api.key()
    forged = h["Authorization"][:-4] + "AAAA"
    assert_problem(
        await api.client.get("/v1/runs", headers={"Authorization": forged}), 401, "unauthenticated"
    )
    expired = await api.key(expires_in=-1)
    assert_problem(await api.client.get("/v1/runs", headers=expired), 401, "unauthenticated")


async def test_the_input_is_validated_against_the_declared_schema(api: Api) -> None:
    h = await api.key()
    r = await api.client.post("/v1/runs", json={"agent": "echo", "input": {"steps": 1}}, headers=h)
    body = assert_problem(r, 422, "validation-error")
    assert "input.text" in body["detail"]
    assert body["errors"][0]["loc"] == ["body", "input", "text"]
    r = await api.client.post("/v1/runs", json={"agent": "nope", "input": {}}, headers=h)
    assert "agent" in assert_problem(r, 422, "validation-error")["detail"]
    r = await api.client.post("/v1/runs", json={"input": {}}, headers=h)
    assert_problem(r, 422, "validation-error")
    r = await api.client.post("/v1/runs", content=b"{not json", headers=h)
    assert_problem(r, 422, "validation-error")


async def test_another_tenants_run_is_404_everywhere(api: Api) -> None:
    mine = await api.key("t1", "alice", ("admin",))
    theirs = await api.key("t2", "bob", ("admin",))
    r = await api.client.post("/v1/runs", json={"agent": "free", "input": {}}, headers=mine)
    run_id = r.json()["id"]
    for method, path in (
        ("GET", f"/v1/runs/{run_id}"),
        ("GET", f"/v1/runs/{run_id}/result"),
        ("GET", f"/v1/runs/{run_id}/steps"),
        ("GET", f"/v1/runs/{run_id}/events?format=json"),
        ("POST", f"/v1/runs/{run_id}/cancel"),
    ):
        assert_problem(await api.client.request(method, path, headers=theirs), 404, "not-found")
        assert_problem(
            await api.client.request(method, path.replace(run_id, "r-missing"), headers=mine),
            404, "not-found",
        )  # fmt: skip
    listed = await api.client.get("/v1/runs", headers=theirs)
    assert listed.json()["runs"] == []


async def test_list_filters_and_cursor_pagination(api: Api) -> None:
    h = await api.key()
    ids = []
    for i in range(7):
        agent = "echo" if i % 2 else "free"
        body = {"agent": agent, "input": {"text": str(i)}}
        ids.append((await api.client.post("/v1/runs", json=body, headers=h)).json()["id"])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = (await api.client.get("/v1/runs", params=params, headers=h)).json()
        seen += [r["id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))
    echoes = (await api.client.get("/v1/runs?agent=echo", headers=h)).json()["runs"]
    assert {r["id"] for r in echoes} == {ids[1], ids[3], ids[5]}
    assert (await api.client.get("/v1/runs?status=completed", headers=h)).json()["runs"] == []
    queued = await api.client.get("/v1/runs?status=queued&waiting_approval=false", headers=h)
    assert len(queued.json()["runs"]) == 7
    assert (await api.client.get("/v1/runs?user=bob", headers=h)).json()["runs"] == []
    assert_problem(await api.client.get("/v1/runs?cursor=zz", headers=h), 400, "bad-request")
    assert_problem(await api.client.get("/v1/runs?limit=501", headers=h), 422, "validation-error")


async def test_cancel_is_idempotent_and_needs_operator(api: Api) -> None:
    owner = await api.key("t1", "alice", ("guest",))
    viewer = await api.key("t1", "vic", ("viewer",))
    operator = await api.key("t1", "olga", ("operator",))
    r = await api.client.post("/v1/runs", json={"agent": "free", "input": {}}, headers=owner)
    run_id = r.json()["id"]
    assert_problem(
        await api.client.post(f"/v1/runs/{run_id}/cancel", headers=viewer), 403, "forbidden"
    )
    first = await api.client.post(
        f"/v1/runs/{run_id}/cancel", json={"reason": "x"}, headers=operator
    )
    assert first.status_code == 202 and first.json()["status"] == "cancelled"
    again = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=owner)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    done = await api.client.get(f"/v1/runs/{run_id}/result", headers=viewer)
    assert done.status_code == 200


async def test_health_ready_and_openapi(api: Api) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).json() == {"status": "ready"}
    spec = (await api.client.get("/openapi.json")).json()
    assert "/v1/runs" in spec["paths"] and "/v1/runs/{run_id}/events" in spec["paths"]
    assert (await api.client.get("/docs")).status_code == 200
    assert_problem(await api.client.get("/nowhere"), 404, "not-found")
    assert_problem(await api.client.delete("/v1/runs"), 405, "method-not-allowed")


@pytest.mark.parametrize("roles", [("viewer",), ("deployment",), ("viewer", "deployment")])
async def test_a_viewer_cannot_start_runs(sqlite_api: Api, roles: tuple[str, ...]) -> None:
    """Nor a key that reads deployment-wide figures (what Prometheus scrapes with)."""
    h = await sqlite_api.key(roles=roles)
    r = await sqlite_api.client.post("/v1/runs", json={"agent": "free"}, headers=h)
    assert_problem(r, 403, "forbidden")
    # Nor cancel a run, even one started under its own user's name.
    own = await sqlite_api.key(roles=("operator",))
    run = (await sqlite_api.client.post("/v1/runs", json={"agent": "free"}, headers=own)).json()
    r = await sqlite_api.client.post(f"/v1/runs/{run['id']}/cancel", headers=h)
    assert_problem(r, 403, "forbidden")


async def test_cancel_of_a_started_run_stops_it_and_compensates(tmp_path: Path) -> None:
    """Through the API, a run a worker has started (charged, then parked): 202 at once;
    the worker takes it up, runs no further step, refunds the charge; the run ends
    ``cancelled``; a second cancel answers 200."""
    url = f"sqlite:///{tmp_path / 'cancel.db'}"
    async with in_process(settings_for(url, workers_inline=1)) as api:
        h = await api.key("t1", "olga", ("operator",))
        body = {"agent": "charge_then_wait", "input": {"amount": 30}}
        run_id = (await api.client.post("/v1/runs", json=body, headers=h)).json()["id"]

        async def parked() -> bool:
            run = (await api.client.get(f"/v1/runs/{run_id}", headers=h)).json()
            return bool(run["status"] == "waiting")

        await until(parked)
        r = await api.client.post(f"/v1/runs/{run_id}/cancel", json={"reason": "x"}, headers=h)
        assert r.status_code == 202 and r.json()["cancel_requested"]
        done = await api.client.get(f"/v1/runs/{run_id}/result?wait=30", headers=h)
        assert done.status_code == 200 and done.json()["status"] == "cancelled"
        steps = (await api.client.get(f"/v1/runs/{run_id}/steps", headers=h)).json()["steps"]
        names = [(s["name"], s["status"]) for s in steps]
        assert ("charge", "succeeded") in names and ("refund", "succeeded") in names
        assert all(n != "after" for n, _ in names)
        again = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=h)
        assert again.status_code == 200 and again.json()["status"] == "cancelled"


def _named_app() -> Any:
    """An agent and a workflow, to submit each by the name a user would write."""
    from agentledger import Agent, App, ScriptedModel, Turn

    named = App("named")

    @named.workflow(name="nightly", version="1")
    async def nightly(ctx: Any, input: Any) -> Any:
        return {"ran": "nightly"}

    model = ScriptedModel([Turn(text="Hello.")], name="scripted-greeter")
    named.add_agent(Agent(name="greeter", model=model, instructions="Greet.", tools=[]))
    return named


async def test_a_run_is_submitted_by_workflow_agent_or_name_and_never_two(
    store_url: str,
) -> None:
    async with in_process(settings_for(store_url), _named_app()) as api:
        h = await api.key()
        for body, name, kind in (
            ({"workflow": "nightly"}, "nightly", "workflow"),
            ({"name": "nightly"}, "nightly", "workflow"),
            ({"agent": "greeter"}, "greeter", "agent"),
            ({"name": "greeter"}, "greeter", "agent"),
            ({"agent": "nightly"}, "nightly", "workflow"),  # as before: any target
        ):
            r = await api.client.post("/v1/runs", json=body, headers=h)
            assert r.status_code == 202, (body, r.text)
            assert (r.json()["agent"], r.json()["kind"]) == (name, kind)
        # A retry naming the same target by another field is the same request.
        key = {**h, "Idempotency-Key": "same-target"}
        first = await api.client.post("/v1/runs", json={"agent": "nightly"}, headers=key)
        again = await api.client.post("/v1/runs", json={"workflow": "nightly"}, headers=key)
        assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
        both = await api.client.post(
            "/v1/runs", json={"agent": "nightly", "workflow": "nightly"}, headers=h
        )
        detail = assert_problem(both, 422, "validation-error")["detail"]
        assert "one of agent, workflow or name" in detail and "agent, workflow" in detail
        none = assert_problem(await api.client.post("/v1/runs", json={}, headers=h), 422,
                              "validation-error")  # fmt: skip
        assert "workflow" in none["detail"] and "agent" in none["detail"]
        wrong = await api.client.post("/v1/runs", json={"workflow": "greeter"}, headers=h)
        detail = assert_problem(wrong, 422, "validation-error")["detail"]
        assert detail.startswith("workflow: greeter is an agent"), detail
        schema = (await api.client.get("/openapi.json")).json()["components"]["schemas"]
        fields = schema["SubmitRun"]["properties"]
        for field in ("agent", "workflow", "name"):
            assert "exactly one of" in fields[field]["description"], fields[field]
