"""``POST /v1/runs``'s fast path (service/_fastpath.py) answers exactly as the FastAPI
route does: each request is sent once as ``application/json`` (eligible for the fast
path) and once as ``application/json; charset=utf-8`` (always the route), and the two
answers are compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry._logs import _internal as logs_api
from opentelemetry.metrics import _internal as metrics_api

from tests.service.conftest import Api, in_process, settings_for

FAST = "application/json"
ROUTED = "application/json; charset=utf-8"
_VARYING = {"id", "created_at", "updated_at", "request_id", "key_id", "links"}


def _scrub(value: Any) -> Any:
    """The answer without what differs between two runs (ids, times)."""
    if isinstance(value, dict):
        return {k: ("*" if k in _VARYING else _scrub(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


async def _both(api: Api, body: bytes, headers: dict[str, str]) -> list[httpx.Response]:
    out = []
    for i, content_type in enumerate((FAST, ROUTED)):
        h = {**headers, "Content-Type": content_type, "X-Request-Id": f"cmp-{i}"}
        out.append(await api.client.post("/v1/runs", content=body, headers=h))
    return out


def _same(fast: httpx.Response, routed: httpx.Response) -> None:
    assert fast.status_code == routed.status_code, (fast.text, routed.text)
    drop = {"x-request-id", "location", "content-length"}
    assert {k: v for k, v in fast.headers.items() if k not in drop} == {
        k: v for k, v in routed.headers.items() if k not in drop
    }
    assert fast.headers["x-request-id"] == "cmp-0" and routed.headers["x-request-id"] == "cmp-1"
    assert _scrub(fast.json()) == _scrub(routed.json())


async def test_answers_match_the_route(api: Api) -> None:
    operator = await api.key()
    viewer = await api.key("t1", "vic", ("viewer",))
    good = json.dumps({"agent": "echo", "input": {"text": "hi"}}).encode()
    cases: list[tuple[str, bytes, dict[str, str], int]] = [
        ("accepted", good, operator, 202),
        ("no key", good, {}, 401),
        ("bad key", good, {"Authorization": "Bearer al_0123456789ab_" + "A" * 30}, 401),
        ("viewer", good, viewer, 403),
        ("unknown agent", b'{"agent": "nope"}', operator, 422),
        ("extra field", b'{"agent": "echo", "zzz": 1}', operator, 422),
        ("malformed JSON", b'{"agent": "echo", ', operator, 422),
        ("not an object", b'["echo"]', operator, 422),
        ("empty body", b"", operator, 422),
        ("NaN input", b'{"agent": "echo", "input": {"x": NaN}}', operator, 422),
        ("bad Idempotency-Key", good, {**operator, "Idempotency-Key": "x" * 300}, 400),
    ]  # fmt: skip
    for name, body, headers, status in cases:
        fast, routed = await _both(api, body, headers)
        assert fast.status_code == status, (name, fast.text)
        _same(fast, routed)


async def test_idempotency_replays_and_reuse_match_the_route(api: Api) -> None:
    h = await api.key()
    first = await api.client.post(
        "/v1/runs",
        json={"agent": "echo", "input": {"text": "1"}},
        headers={**h, "Idempotency-Key": "k1"},
    )
    assert first.status_code == 202
    replay = json.dumps({"agent": "echo", "input": {"text": "1"}}).encode()
    fast, routed = await _both(api, replay, {**h, "Idempotency-Key": "k1"})
    assert fast.headers["Idempotent-Replayed"] == "true"
    assert fast.json()["id"] == routed.json()["id"] == first.json()["id"]
    _same(fast, routed)
    reused = json.dumps({"agent": "echo", "input": {"text": "2"}}).encode()
    fast, routed = await _both(api, reused, {**h, "Idempotency-Key": "k1"})
    assert fast.status_code == 422 and fast.json()["type"].endswith("idempotency-key-reused")
    _same(fast, routed)


async def test_quota_refusals_match_the_route(tmp_path: Path) -> None:
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'q.db'}", runs_per_minute=2)) as api:
        h = await api.key()
        good = json.dumps({"agent": "echo", "input": {"text": "hi"}}).encode()
        fast, routed = await _both(api, good, h)  # the quota's two runs
        _same(fast, routed)
        fast, routed = await _both(api, good, h)
        assert fast.status_code == 429 and fast.headers["Retry-After"]
        _same(fast, routed)


async def test_a_plain_submit_skips_routing_and_others_do_not(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path answers plain submits (no FastAPI route resolved in the scope);
    what it does not serve goes through the route."""
    # No OpenTelemetry provider configured in this process (another test may have set
    # the global one): with one, FastAPI's own request spans want its route, and the
    # fast path steps aside (tested below).
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(metrics_api, "_METER_PROVIDER", None)
    monkeypatch.setattr(logs_api, "_LOGGER_PROVIDER", None)
    h = await api.key()
    seen: list[dict[str, Any]] = []

    async def call(content_type: str) -> int:
        headers = [
            (b"content-type", content_type.encode()),
            (b"authorization", h["Authorization"].encode()),
        ]
        body = json.dumps({"agent": "echo", "input": {"text": "hi"}}).encode()
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/runs", "raw_path": b"/v1/runs",
            "query_string": b"", "root_path": "", "headers": headers,
            "client": ("127.0.0.1", 1), "server": ("api", 80),
        }  # fmt: skip
        sent = False
        status: list[int] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await api.app(scope, receive, send)
        seen.append(scope)
        return status[0]

    assert await call(FAST) == 202
    assert "endpoint" not in seen[-1]
    assert await call(ROUTED) == 202
    assert "endpoint" in seen[-1]


async def test_with_fastapi_telemetry_on_submits_take_the_route(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configured OpenTelemetry provider turns FastAPI's own request spans on: they
    want the route, so the front steps aside and the span names it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    h = await api.key()
    r = await api.client.post(
        "/v1/runs", json={"agent": "echo", "input": {"text": "hi"}}, headers=h
    )
    assert r.status_code == 202, r.text
    if getattr(api.app, "_native_telemetry", None) is None:
        pytest.skip("this FastAPI has no native telemetry")
    names = [s.name for s in exporter.get_finished_spans()]
    assert "POST /v1/runs" in names, names


async def test_an_unhandled_error_is_the_same_500_problem_on_both_paths(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash inside the endpoint: the fast path answers what Starlette's
    ServerErrorMiddleware answers for the route (the catch-all handler's 500 problem
    document, with the request id), and the error still reaches the server."""
    from agentledger.service._routers import runs as runs_router

    def boom(value: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(runs_router, "journal_value", boom)
    h = await api.key()
    transport = httpx.ASGITransport(app=api.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        body = json.dumps({"agent": "echo", "input": {"text": "hi"}}).encode()
        answers = []
        for i, content_type in enumerate((FAST, ROUTED)):
            headers = {**h, "Content-Type": content_type, "X-Request-Id": f"cmp-{i}"}
            answers.append(await client.post("/v1/runs", content=body, headers=headers))
    fast, routed = answers
    assert fast.status_code == 500, fast.text
    assert fast.headers["content-type"].startswith("application/problem+json")
    assert fast.json()["request_id"] == "cmp-0"
    _same(fast, routed)
    transport = httpx.ASGITransport(app=api.app)  # raising: the error goes on
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        with pytest.raises(RuntimeError, match="boom"):
            await client.post("/v1/runs", content=body, headers={**h, "Content-Type": FAST})
