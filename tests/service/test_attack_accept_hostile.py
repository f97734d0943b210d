"""Hostile submits over HTTP, on each backend: odd numbers and text in the input, the
same body through the submit fast path and through FastAPI's route, keys at their
limits; then the audit chain of what was accepted verifies."""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentledger.service._queries import audit as service_audit
from tests.service.conftest import Api

# Written by hand: a lone surrogate and a NUL as JSON escapes, -0.0, the largest and
# the smallest doubles, an integer past 64 bits, deep-ish nesting, a long string.
HOSTILE = (
    '{"agent": "free", "input": {"nul": "a\\u0000b", "sur": "x\\ud800y", "neg": -0.0,'
    ' "big": 1e308, "tiny": 5e-324, "int": 123456789012345678901234567890,'
    ' "deep": [[[[[[[[[[{"k": "\u00e9\U0001f600"}]]]]]]]]]], "long": "' + "z" * 20000 + '"}}'
)


async def post(api: Api, body: str, headers: dict[str, str], ctype: str) -> httpx.Response:
    return await api.client.post(
        "/v1/runs", content=body.encode(), headers={**headers, "Content-Type": ctype}
    )


async def verify(api: Api) -> int:
    await api.store.transact(service_audit.seal)
    checked, broken = await api.store.read(lambda tx: service_audit.verify_chain(tx))
    assert broken == [], broken
    return int(checked)


async def test_hostile_values_replay_alike_on_both_paths_and_verify(api: Api) -> None:
    h = await api.key()
    h["Idempotency-Key"] = "hostile-1"
    # The fast path takes exactly "application/json"; FastAPI's route anything else.
    first = await post(api, HOSTILE, h, "application/json")
    assert first.status_code == 202, first.text
    routed = await post(api, HOSTILE, h, "application/json; charset=utf-8")
    assert routed.status_code == 202, routed.text
    assert routed.headers.get("Idempotent-Replayed") == "true"
    assert routed.content == (await post(api, HOSTILE, h, "application/json")).content
    # Another spelling of the same JSON (key order, spaces): the same body.
    respelled = json.dumps(json.loads(HOSTILE), sort_keys=True, indent=1)
    again = await post(api, respelled, h, "application/json")
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
    # Another body, however slightly: 422 on both paths.
    changed = HOSTILE.replace('"neg": -0.0', '"neg": -0.5')
    for ctype in ("application/json", "application/json; charset=utf-8"):
        reused = await post(api, changed, h, ctype)
        assert reused.status_code == 422, reused.text
        assert reused.json()["type"].endswith("idempotency-key-reused"), reused.text
    # The stored input: NUL and the surrogate as U+FFFD, the numbers as sent.
    row = await api.store.read(lambda tx: tx.fetchall("SELECT input FROM runs"))
    assert len(row) == 1
    stored = json.loads(row[0]["input"])
    assert stored["nul"] == "a\ufffdb" and stored["sur"] == "x\ufffdy"
    assert str(stored["neg"]) == "-0.0" and stored["big"] == 1e308
    assert stored["int"] == 123456789012345678901234567890
    assert await verify(api) == 2


async def test_keys_at_their_limits(api: Api) -> None:
    h: dict[str, Any] = await api.key()
    body = {"agent": "free", "input": {"n": 1}}
    longest = b"~" * 255
    cases = ((longest, 202), (b"~" * 256, 400), ("caf\u00e9".encode(), 400), (b'"q"', 202))
    for key, status in cases:
        h["Idempotency-Key"] = key  # as bytes: UTF-8 on the wire
        reply = await api.client.post("/v1/runs", json=body, headers=h)
        assert reply.status_code == status, (key, reply.text)
    # A quoted key is the key within the quotes.
    h["Idempotency-Key"] = "q"
    same = await api.client.post("/v1/runs", json=body, headers=h)
    assert same.headers.get("Idempotent-Replayed") == "true"
    # Inputs a journal cannot hold are refused before any write (422, not 500).
    for text in ('{"agent": "free", "input": {"x": 1e999}}',
                 '{"agent": "free", "input": {"x": NaN}}'):  # fmt: skip
        h["Idempotency-Key"] = "bad-" + str(len(text))
        reply = await post(api, text, h, "application/json")
        assert reply.status_code in (400, 422), reply.text
    assert await verify(api) == 4
