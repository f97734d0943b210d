"""Hostile keys, Idempotency-Keys and event streams."""

from __future__ import annotations

import asyncio

import pytest

from tests.service.conftest import Api
from tests.service.test_runs_api import assert_problem

BAD_TOKENS: list[bytes] = [
    b"Bearer al_",
    b"Bearer al__",
    b"Bearer al___",
    b"Bearer al_0123456789ab_",
    b"Bearer " + ("al_0123456789ab_" + "\u00e9" * 20).encode(),
    b"Bearer \xff\xfe\xfd",
    b"Bearer " + b"a" * 10_000,
    b"Bearer al_0123456789ab_" + b"A" * 10_000,
    b"Bearer al_0123456789ab_AAAAAAAAAAAAAAAAAAAA\x00",
    b"Bearer al_0123456789ab_AAAAAAAAAAAAAAAAAAAA\n",
    b"bearer  al_0123456789ab_AAAAAAAAAAAAAAAAAAAA",
]


async def test_malformed_bearer_tokens_are_401_problems(api: Api) -> None:
    for token in BAD_TOKENS:
        r = await api.client.get("/v1/runs", headers=[(b"authorization", token)])
        assert_problem(r, 401, "unauthenticated")


async def test_a_real_key_id_with_a_wrong_secret_or_a_revoked_key_is_401(api: Api) -> None:
    h = await api.key("t1", "alice", ("admin",))
    full = h["Authorization"].removeprefix("Bearer ")
    key_id = full.split("_")[1]
    for forged in (f"al_{key_id}_{'A' * 40}", full + "x", full.upper().replace("AL_", "al_")):
        r = await api.client.get("/v1/runs", headers={"Authorization": f"Bearer {forged}"})
        assert_problem(r, 401, "unauthenticated")
    await api.store.transact(
        lambda tx: tx.execute("UPDATE api_keys SET revoked_at = 1 WHERE id = :i", {"i": key_id})
    )
    api.app.state.keys._rows.clear()
    assert_problem(await api.client.get("/v1/runs", headers=h), 401, "unauthenticated")


async def test_roles_a_key_lacks_are_refused(api: Api) -> None:
    viewer = await api.key("t1", "vic", ("viewer",))
    guest = await api.key("t1", "gina", ("guest",))
    operator = await api.key("t1", "olga", ("operator",))
    assert_problem(
        await api.client.post("/v1/runs", json={"agent": "free"}, headers=viewer), 403, "forbidden"
    )
    assert_problem(await api.client.get("/v1/audit", headers=operator), 403, "forbidden")
    run = (await api.client.post("/v1/runs", json={"agent": "free"}, headers=operator)).json()
    # A guest (a policy-named role) can neither cancel another user's run nor read the
    # tenant's audit chain.
    assert_problem(
        await api.client.post(f"/v1/runs/{run['id']}/cancel", headers=guest), 403, "forbidden"
    )
    assert_problem(await api.client.get("/v1/audit", headers=guest), 403, "forbidden")


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"a" * 255, 202),
        (b"a" * 256, 400),
        (b'"' + b"a" * 255 + b'"', 202),
        (b"", 400),
        (b'""', 400),
        (b"caf\xc3\xa9", 400),
        (b"a\tb", 400),
        (b"\x7f", 400),
        (b" x ", 202),
    ],
)
async def test_idempotency_key_syntax(sqlite_api: Api, raw: bytes, status: int) -> None:
    h = await sqlite_api.key()
    r = await sqlite_api.client.post(
        "/v1/runs",
        json={"agent": "free"},
        headers=[(b"authorization", h["Authorization"].encode()), (b"idempotency-key", raw)],
    )
    assert r.status_code == status, r.text
    if status == 400:
        assert_problem(r, 400, "invalid-idempotency-key")


async def test_idempotency_keys_are_per_tenant_and_race_safely(api: Api) -> None:
    a = await api.key("ta", "alice", ("operator",))
    b = await api.key("tb", "bob", ("operator",))
    key = {"Idempotency-Key": "same"}
    ra = await api.client.post("/v1/runs", json={"agent": "free", "input": 1}, headers={**a, **key})
    rb = await api.client.post("/v1/runs", json={"agent": "free", "input": 2}, headers={**b, **key})
    assert ra.status_code == rb.status_code == 202
    assert ra.json()["id"] != rb.json()["id"]
    assert "Idempotent-Replayed" not in rb.headers
    # Concurrent, same key, different bodies: one run; the others replay it or get 422.
    race = {"Idempotency-Key": "race"}
    answers = await asyncio.gather(
        *[
            api.client.post(
                "/v1/runs", json={"agent": "free", "input": i % 2}, headers={**a, **race}
            )
            for i in range(20)
        ]
    )
    assert all(r.status_code in (202, 422) for r in answers), [r.text for r in answers]
    ids = {r.json()["id"] for r in answers if r.status_code == 202}
    assert len(ids) == 1
    listed = (await api.client.get("/v1/runs", params={"limit": 500}, headers=a)).json()
    assert len(listed["runs"]) == 2


async def test_event_resume_points_hostile(api: Api) -> None:
    h = await api.key()
    run = (await api.client.post("/v1/runs", json={"agent": "free"}, headers=h)).json()
    url = f"/v1/runs/{run['id']}/events"
    for value in (b"garbage", b"-1", str(2**63).encode(), b"1e3", "\u0661".encode()):
        auth = (b"authorization", h["Authorization"].encode())
        r = await api.client.get(url, headers=[auth, (b"last-event-id", value)])
        assert_problem(r, 400, "bad-request")
    for after in ("-1", str(2**63), "x"):
        r = await api.client.get(url, params={"after": after}, headers=h)
        assert_problem(r, 422, "validation-error")
    page = await api.client.get(url, params={"after": 10**9, "format": "json"}, headers=h)
    assert page.status_code == 200 and page.json()["events"] == []
    other = await api.key("t2", "eve", ("admin",))
    assert_problem(await api.client.get(url, headers=other), 404, "not-found")
    assert_problem(
        await api.client.get(url, params={"format": "json"}, headers=other), 404, "not-found"
    )
