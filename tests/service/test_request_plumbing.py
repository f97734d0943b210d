"""The service's request plumbing, on the ASGI app in process: request ids, the body
limit (one middleware), the bearer scheme in the OpenAPI document, the sealer's slices."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from agentledger import _sealer as sealer
from agentledger.store import NewRun
from tests.service.conftest import Api
from tests.service.test_runs_api import assert_problem

SUBMIT = {"agent": "echo", "input": {"text": "hi"}}


async def test_a_well_formed_request_id_is_kept_and_echoed_once(api: Api) -> None:
    h = await api.key()
    r = await api.client.post("/v1/runs", json=SUBMIT, headers={**h, "X-Request-Id": "rq-1.a:b"})
    assert r.status_code == 202, r.text
    assert r.headers.get_list("x-request-id") == ["rq-1.a:b"]
    refused = await api.client.get("/v1/runs", headers={"X-Request-Id": "rq-2"})
    body = assert_problem(refused, 401, "unauthenticated")
    assert body["request_id"] == "rq-2" and refused.headers.get_list("x-request-id") == ["rq-2"]


async def test_a_malformed_or_missing_request_id_is_replaced(api: Api) -> None:
    h = await api.key()
    for given in ({"X-Request-Id": "bad id with spaces"}, {"X-Request-Id": "x" * 129}, {}):
        r = await api.client.post("/v1/runs", json=SUBMIT, headers={**h, **given})
        assert r.status_code == 202, r.text
        (rid,) = r.headers.get_list("x-request-id")
        assert rid.startswith("req_") and len(rid) == 20


async def test_a_streamed_body_over_the_limit_is_413_with_the_request_id(sqlite_api: Api) -> None:
    """No Content-Length (chunked): refused once the chunks pass the limit."""
    h = await sqlite_api.key("t1", "alice", ("admin",))

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"agent": "echo", "input": {"text": "'
        for _ in range(40):
            yield b"x" * 65536  # 2.5 MB in all, over the 1 MB limit
        yield b'"}}'

    r = await sqlite_api.client.post(
        "/v1/runs",
        content=chunks(),
        headers={**h, "Content-Type": "application/json", "X-Request-Id": "big-1"},
    )
    body = assert_problem(r, 413, "payload-too-large")
    assert body["request_id"] == "big-1" and r.headers["x-request-id"] == "big-1"


async def test_openapi_declares_the_bearer_scheme_on_the_runs_operations(api: Api) -> None:
    doc = (await api.client.get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key: `Bearer al_<id>_<secret>`",
    }
    for path, method in (("/v1/runs", "post"), ("/v1/runs", "get"), ("/v1/runs/{run_id}", "get")):
        assert doc["paths"][path][method]["security"] == [{"HTTPBearer": []}], (path, method)
    # The principal is resolved by the scheme itself: no stray parameter is documented.
    params = [p["name"] for p in doc["paths"]["/v1/runs"]["post"].get("parameters", [])]
    assert params == [], params


async def test_seal_once_seals_at_most_batch_times_max_batches(api: Api) -> None:
    """The serve process seals in small slices (service/_app.py); the sizes are honoured."""
    # Runs created through the store's own path: their events are written unsealed.
    for i in range(6):
        await api.store.create_run(
            NewRun("agent", "echo", "1", {"text": "hi"}, tenant_id="t1", request_id=f"rq{i}")
        )

    def unsealed(tx) -> int:  # type: ignore[no-untyped-def]
        return int(tx.fetchall("SELECT COUNT(*) AS n FROM events WHERE hash IS NULL")[0]["n"])

    before = await api.store.read(unsealed)
    assert before >= 6, before  # each creation writes its event unsealed
    assert await sealer.seal_once(api.store, batch=3, max_batches=2) == 6
    assert await api.store.read(unsealed) == before - 6
    assert json.dumps(await sealer.seal_once(api.store)) == str(before - 6)
