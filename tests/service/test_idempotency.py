"""Idempotency-Key: one run per key and body, replays, conflicts, malformed keys."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from agentledger.service import _accepting as accepting
from agentledger.store import open_store
from tests.service.conftest import Api, in_process, mint, served, settings_for
from tests.service.test_runs_api import assert_problem

BODY = {"agent": "echo", "input": {"text": "book it"}}


async def count_runs(api: Api) -> int:
    counts = await api.store.count_runs()
    return sum(counts.values())


async def test_fifty_concurrent_posts_over_http_make_one_run(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    store = open_store(url)
    await store.open()
    try:
        with served(settings_for(url)) as srv:
            h = await mint(srv.app, "t1", "alice", ["operator"], 3600)
            h["Idempotency-Key"] = "order-42"
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as client:
                replies = await asyncio.gather(
                    *[client.post("/v1/runs", json=BODY, headers=h) for _ in range(50)]
                )
        assert {r.status_code for r in replies} == {202}
        assert len({r.content for r in replies}) == 1  # the same body, byte for byte
        replayed = [r for r in replies if r.headers.get("Idempotent-Replayed") == "true"]
        assert len(replayed) == 49
        assert sum((await store.count_runs()).values()) == 1
    finally:
        await store.close()


async def test_concurrent_posts_through_two_api_processes_make_one_run(store_url: str) -> None:
    """Two app instances (two stores, as two serve processes would have) race one key."""
    async with in_process(settings_for(store_url)) as a, in_process(settings_for(store_url)) as b:
        h = await a.key()
        rounds = 8
        for n in range(rounds):
            h["Idempotency-Key"] = f"k-two-procs-{n}"
            replies = await asyncio.gather(
                *[(a if i % 2 else b).client.post("/v1/runs", json=BODY, headers=h)
                  for i in range(20)]
            )  # fmt: skip
            assert {r.status_code for r in replies} == {202}, [r.text for r in replies]
            assert len({r.json()["id"] for r in replies}) == 1, f"round {n}"
        assert await count_runs(a) == rounds


async def test_same_key_different_body_is_422_and_keys_are_per_tenant(api: Api) -> None:
    h = await api.key("t1")
    h["Idempotency-Key"] = "abc"
    first = await api.client.post("/v1/runs", json=BODY, headers=h)
    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
    other = {"agent": "echo", "input": {"text": "something else"}}
    assert_problem(
        await api.client.post("/v1/runs", json=other, headers=h), 422, "idempotency-key-reused"
    )
    # Key order in the JSON does not change the fingerprint (canonical JSON).
    same = await api.client.post(
        "/v1/runs", content=b'{"input": {"text": "book it"}, "agent": "echo"}',
        headers={**h, "content-type": "application/json"},
    )  # fmt: skip
    assert same.status_code == 202 and same.headers["Idempotent-Replayed"] == "true"
    assert same.json() == first.json()
    h2 = await api.key("t2", "bob")
    h2["Idempotency-Key"] = "abc"
    theirs = await api.client.post("/v1/runs", json=other, headers=h2)
    assert theirs.status_code == 202 and theirs.json()["id"] != first.json()["id"]


async def test_malformed_keys_are_400(api: Api) -> None:
    h = await api.key()
    for bad in ("", "x" * 256, "tab\there", "é"):
        headers = {**h, "Idempotency-Key": bad}
        try:
            r = await api.client.post("/v1/runs", json=BODY, headers=headers)
        except (UnicodeEncodeError, httpx.LocalProtocolError):
            continue  # the client refuses to send it at all
        assert_problem(r, 400, "invalid-idempotency-key")
    ok = await api.client.post("/v1/runs", json=BODY, headers={**h, "Idempotency-Key": '"q-1"'})
    assert ok.status_code == 202
    assert await count_runs(api) == 1


async def test_a_request_in_flight_with_the_same_key_is_409(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'flight.db'}"
    async with in_process(settings_for(url, idempotency_wait=0.0)) as api:
        h = await api.key()
        h["Idempotency-Key"] = "slow"
        release = threading.Event()
        entered = threading.Event()
        real = accepting.accept

        def held(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            release.wait(30)
            return real(*args, **kwargs)

        accepting.accept = held  # type: ignore[assignment]
        try:
            first = asyncio.create_task(api.client.post("/v1/runs", json=BODY, headers=h))
            await asyncio.to_thread(entered.wait, 10)
            second = await api.client.post("/v1/runs", json=BODY, headers=h)
            assert_problem(second, 409, "idempotency-in-flight")
            assert second.headers["Retry-After"] == "1"
            release.set()
            assert (await first).status_code == 202
        finally:
            accepting.accept = real  # type: ignore[assignment]
            release.set()
        third = await api.client.post("/v1/runs", json=BODY, headers=h)
        assert third.headers["Idempotent-Replayed"] == "true"


async def test_an_expired_key_starts_a_new_run(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'ttl.db'}"
    async with in_process(settings_for(url, idempotency_ttl=0.05)) as api:
        h = {**(await api.key()), "Idempotency-Key": "short"}
        first = await api.client.post("/v1/runs", json=BODY, headers=h)
        await asyncio.sleep(0.1)  # the TTL itself is what is under test
        second = await api.client.post("/v1/runs", json=BODY, headers=h)
        assert first.json()["id"] != second.json()["id"]
        assert "Idempotent-Replayed" not in second.headers
