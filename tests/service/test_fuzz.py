"""Property-based fuzzing of every operation in /openapi.json (schemathesis), over real
HTTP, with and without a valid key: never a 5xx, every error is problem+json."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from agentledger.service import create_app
from agentledger.service._auth import create_key
from agentledger.store import open_store
from tests.service import service_app
from tests.service.conftest import PEPPER, served, settings_for

SPEC = create_app(settings_for("sqlite:///:memory:"), service_app.app).openapi()
schema = schemathesis.openapi.from_dict(SPEC)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('fuzz')) / 'fuzz.db'}"

    async def mint() -> str:
        store = open_store(url)
        await store.open()
        try:
            key, _ = await create_key(store, PEPPER, "t1", "fuzzer", ["admin"], 3600)
            return key
        finally:
            await store.close()

    key = asyncio.run(mint())
    with served(settings_for(url, sse_heartbeat=0.2)) as srv:
        yield srv.base_url, {"Authorization": f"Bearer {key}"}


def check_problem(response: Any) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        content_type = response.headers.get("content-type") or [""]
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        assert content_type.startswith("application/problem+json"), (
            response.status_code,
            content_type,
            response.text,
        )
        body = response.json()
        assert body["type"].startswith("https://agentledger.dev/problems/")
        assert body["status"] == response.status_code and body["request_id"]


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_5xx_and_every_error_is_problem_json(
    case: schemathesis.Case, server: tuple[str, dict[str, str]]
) -> None:
    base_url, auth = server
    if case.query and case.query.get("format") != "json" and "events" in case.path:
        case.query["format"] = "json"  # a stream of a live run would not end
    for headers in (auth, {}):
        merged = {**(case.headers or {}), **headers}
        if not headers:
            merged.pop("Authorization", None)
        response = case.call(base_url=base_url, headers=merged, timeout=10)
        case.validate_response(response, checks=[not_a_server_error])
        check_problem(response)
