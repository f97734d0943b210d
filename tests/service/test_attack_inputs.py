"""Hostile requests: garbage ids, cursors, bodies and headers get a problem, never a 5xx."""

from __future__ import annotations

import base64
import json

import pytest

from tests.service.conftest import Api
from tests.service.test_runs_api import PROBLEM

NUL_PATHS = [
    "/v1/runs/%00",
    "/v1/runs/a%00b/events",
    "/v1/runs/a%00b/result",
    "/v1/runs/a%00b/steps",
    "/v1/runs/a%00b/audit",
    "/v1/runs?agent=%00",
    "/v1/runs?user=a%00",
    "/v1/runs?version=%00",
    "/v1/runs/%ED%A0%80",
]


def _no_5xx(r) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith(PROBLEM), r.text


async def test_nul_and_bad_utf8_in_paths_and_queries_are_never_5xx(api: Api) -> None:
    h = await api.key("t1", "alice", ("admin",))
    for path in NUL_PATHS:
        _no_5xx(await api.client.get(path, headers=h))
    for path in ("/v1/runs/a%00/cancel", "/v1/approvals/a%00/decision"):
        r = await api.client.post(
            path, json={"decision": "approve", "arguments_hash": "0" * 64}, headers=h
        )
        _no_5xx(r)
        assert r.status_code in (400, 404, 422), r.text


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        _b64(b'{"a": 1}'),
        _b64(b"[]"),
        _b64(b"[1]"),
        _b64(b'["NaN", "x"]'),
        _b64(b'[1e400, "x"]'),
        _b64(b'[-1, "\\u0000"]'),
        _b64(b"\xff\xfe"),
        _b64(b"null"),
        "!!!!",
        "",
    ],
)
async def test_garbage_cursors_are_400_not_5xx(sqlite_api: Api, cursor: str) -> None:
    h = await sqlite_api.key("t1", "alice", ("admin",))
    r = await sqlite_api.client.get("/v1/runs", params={"cursor": cursor}, headers=h)
    _no_5xx(r)


async def test_hostile_bodies_are_problems_never_5xx(api: Api) -> None:
    h = await api.key("t1", "alice", ("admin",))
    bodies: list[bytes] = [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"agent": "free", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"agent": "free", "input": ' + b"[" * 250 + b"]" * 250 + b"}",
        b'{"agent": "free", "input": NaN}',
        b'{"agent": "free", "input": {"x": Infinity}}',
        b'{"agent": "free", "input": 1e400}',
        b'{"agent": "free", "input": ' + b"9" * 5000 + b"}",
        b'{"agent": "free", "input": ' + b"9" * 4000 + b"}",
        b'{"agent": "free", "input": "a\\u0000b"}',
        b'{"agent": "free", "input": {"a\\u0000": "\\ud800"}}',
        b'{"agent": "free", "webhook": "http://x/\\u0000"}',
        b'{"agent": "\\u0000"}',
        b"\xff\xfe\x00",
        b"",
        b"null",
    ]
    for raw in bodies:
        for idem in (None, "k-" + str(len(raw))):
            headers = {**h, "Content-Type": "application/json"}
            if idem:
                headers["Idempotency-Key"] = idem
            r = await api.client.post("/v1/runs", content=raw, headers=headers)
            _no_5xx(r)
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = await api.client.post(
            "/v1/runs", content=b'{"agent": "free"}', headers={**h, "Content-Type": ctype}
        )
        _no_5xx(r)
    r = await api.client.post(
        "/v1/runs/x/cancel",
        content=b"[" * 100_000,
        headers={**h, "Content-Type": "application/json"},
    )
    _no_5xx(r)


async def test_a_10_mb_body_is_413(sqlite_api: Api) -> None:
    h = await sqlite_api.key("t1", "alice", ("admin",))
    big = json.dumps({"agent": "free", "input": {"blob": "x" * 10_000_000}}).encode()
    r = await sqlite_api.client.post(
        "/v1/runs", content=big, headers={**h, "Content-Type": "application/json"}
    )
    assert r.status_code == 413, r.status_code
    assert r.headers["content-type"].startswith(PROBLEM)
