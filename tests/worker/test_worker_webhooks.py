"""Workers deliver webhooks: no ``serve`` process needed, one sender per attempt.

Real worker processes, a real HTTP receiver on loopback, every store backend. The
receiver counts: each event's posts, and how many of them were in flight at once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentledger.service._queries import webhooks as service_webhooks
from agentledger.service._webhooks import verify
from agentledger.store import open_store
from tests.engine.helpers import Env, wait_for
from tests.loopback_http import QuietHandler, serving


@dataclass
class Receiver:
    """A webhook receiver on loopback that fails the first ``fail_first`` posts of each
    event (HTTP 500) and holds every post ``hold`` seconds, so that overlapping sends of
    one event would be seen in flight together."""

    fail_first: int = 0
    hold: float = 0.0
    posts: list[dict[str, Any]] = field(default_factory=list)
    in_flight: Counter[str] = field(default_factory=Counter)
    max_in_flight: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        event_id = headers["agentledger-event-id"]
        with self.lock:
            self.in_flight[event_id] += 1
            self.max_in_flight[event_id] = max(
                self.max_in_flight[event_id], self.in_flight[event_id]
            )
            seen = sum(1 for p in self.posts if p["id"] == event_id)
            self.posts.append({"id": event_id, "headers": headers, "body": body})
        threading.Event().wait(self.hold)
        with self.lock:
            self.in_flight[event_id] -= 1
        return 500 if seen < self.fail_first else 204

    def delivered(self) -> Counter[str]:
        """Posts per event id."""
        with self.lock:
            return Counter(p["id"] for p in self.posts)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = got.handle({k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler, "/hooks") as got.url:
        yield got


@pytest.fixture
def env(backend_env: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    """Every backend; events sealed (and their webhooks enqueued) and retried quickly."""
    monkeypatch.setenv("AGENTLEDGER_AUDIT_SEAL_EVERY", "0.05")
    monkeypatch.setenv("AGENTLEDGER_WEBHOOK_BACKOFF", "0.05")
    monkeypatch.setenv("AGENTLEDGER_WEBHOOK_ALLOW_HOSTS", "127.0.0.1")  # the receiver
    return backend_env


def _submit_with_webhook(env: Env, url: str, n: int) -> str:
    """A ``quick`` run whose events go to ``url`` (as ``POST /v1/runs`` stores it)."""
    run_id = env.submit("quick", {"n": n})

    async def set_webhook(store: Any) -> None:
        await store.transact(
            lambda tx: tx.execute(
                "UPDATE runs SET webhook = :w WHERE id = :id", {"w": url, "id": run_id}
            )
        )

    env._store(set_webhook)
    return run_id


def _secret(env: Env) -> str:
    async def get() -> str:
        store = open_store(env.url)
        await store.open()
        try:
            return str(await store.transact(service_webhooks.webhook_secret, "default"))
        finally:
            await store.close()

    return asyncio.run(get())


def _deliveries(env: Env) -> list[dict[str, Any]]:
    return list(env._store(lambda s: s.transact(service_webhooks.deliveries)))


def _all_delivered(env: Env, n: int) -> bool:
    rows = _deliveries(env)
    return len(rows) == n and all(r["status"] == "delivered" for r in rows)


def test_a_worker_alone_delivers_signed_webhooks_and_retries_with_one_id(
    env: Env, receiver: Receiver
) -> None:
    receiver.fail_first = 1  # each event's first post fails: retried, same id
    runs = [_submit_with_webhook(env, receiver.url, n) for n in range(2)]
    env.start_worker()  # no `serve` process anywhere
    with env.one_store():
        wait_for(lambda: _all_delivered(env, len(runs)), 60, "each run's event delivered")
    secret = _secret(env)
    assert {p["headers"]["agentledger-event"] for p in receiver.posts} == {"run.completed"}
    assert {json.loads(p["body"])["run_id"] for p in receiver.posts} == set(runs)
    for post in receiver.posts:
        assert verify(secret, post["headers"]["agentledger-signature"], post["body"])
        assert json.loads(post["body"])["id"] == post["id"]  # the same id on every attempt
    assert sorted(receiver.delivered().values()) == [2, 2]  # failed once, then delivered
    assert {r["attempts"] for r in _deliveries(env)} == {2}


def test_two_workers_never_send_one_delivery_attempt_twice(env: Env, receiver: Receiver) -> None:
    # Each post is held longer than a dispatcher's poll: a second sender of the same
    # delivery would overlap it at the receiver.
    receiver.hold = 1.0
    runs = [_submit_with_webhook(env, receiver.url, n) for n in range(12)]
    env.start_worker(concurrency=4)
    env.start_worker(concurrency=4)
    with env.one_store():
        wait_for(lambda: _all_delivered(env, len(runs)), 120, "every run's event delivered")
    assert len(receiver.delivered()) == len(runs)
    assert set(receiver.delivered().values()) == {1}, receiver.delivered()  # one post each
    assert set(receiver.max_in_flight.values()) == {1}
    assert {r["lease_epoch"] for r in _deliveries(env)} == {1}  # each under its first claim


async def test_an_attempt_is_written_back_only_under_its_own_claim(store: Any) -> None:
    """A claimer whose lease ran out cannot overwrite the outcome of the next claimer."""
    await store.transact(
        service_webhooks._insert,
        "evt_x_1",
        "default",
        "x",
        "http://127.0.0.1:9/",
        "run.completed",
        {},
    )
    now = time.time()
    late = await store.transact(service_webhooks.claim_due, now, 10, 0.0, "a")
    later = await store.transact(service_webhooks.claim_due, now + 1, 10, 60.0, "b")
    assert [r["lease_epoch"] for r in late + later] == [1, 2]
    assert not await store.transact(
        service_webhooks.settle_delivery, "evt_x_1", False, "HTTP 500", now, False, 1
    )
    assert await store.transact(
        service_webhooks.settle_delivery, "evt_x_1", True, None, now, False, 2
    )
    (row,) = await store.transact(service_webhooks.deliveries)
    assert row["status"] == "delivered" and row["attempts"] == 1 and row["last_error"] is None


def test_a_worker_alone_warns_of_an_approval_about_to_expire(env: Env, receiver: Receiver) -> None:
    turns = [{"calls": [["keyed_write", {"item": "a1"}]]}, {"text": "done"}]
    run_id = env.submit("scripted", {"turns": turns, "approve": ["keyed_write"]})

    async def set_webhook(store: Any) -> None:
        sql = "UPDATE runs SET webhook = :w WHERE id = :id"
        await store.transact(lambda tx: tx.execute(sql, {"w": receiver.url, "id": run_id}))

    env._store(set_webhook)
    env.start_worker()
    (approval,) = wait_for(lambda: env.approvals(run_id), 60, "the approval to be requested")

    async def near_expiry(store: Any) -> None:
        # As if 90 % of its time to live had passed: 100 s left of 1000.
        sql = "UPDATE approvals SET requested_at = :r, expires_at = :e WHERE id = :id"
        now = time.time()
        params = {"r": now - 900.0, "e": now + 100.0, "id": approval.id}
        await store.transact(lambda tx: tx.execute(sql, params))

    env._store(near_expiry)
    warning = f"evt_{approval.id}_expiring"
    wait_for(lambda: warning in receiver.delivered(), 60, "the approval.expiring webhook")
    (post,) = [p for p in receiver.posts if p["id"] == warning]
    assert post["headers"]["agentledger-event"] == "approval.expiring"
    assert verify(_secret(env), post["headers"]["agentledger-signature"], post["body"])
    assert json.loads(post["body"])["data"]["approval_id"] == approval.id
