"""A receiver that answers slowly, a byte at a time (each within the HTTP timeout), does
not stretch one delivery attempt past its claim: no second dispatcher sends the same
delivery while the first is still sending it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentledger.service._egress import Egress
from agentledger.service._queries import webhooks as service_webhooks
from agentledger.service._webhooks import Dispatcher
from agentledger.store import open_store
from tests.loopback_http import QuietHandler, serving

# The dispatchers' HTTP timeout; a claim lasts three of them. The 2 s between the end of
# an attempt and the end of its claim outlast a stall of the loaded machine (at 0.3 s,
# a 0.6 s stall of this process let the second dispatcher claim the delivery while the
# first was still sending it). The receiver drips far longer than a claim all the same.
TIMEOUT = 1.0


class Dripping:
    """Answers 200 with a body sent a byte every TIMEOUT / 5 for 20 timeouts; counts
    the requests it is serving at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.serving = 0
        self.most = 0
        self.started = threading.Event()

    def enter(self) -> None:
        with self.lock:
            self.serving += 1
            self.most = max(self.most, self.serving)
        self.started.set()

    def leave(self) -> None:
        with self.lock:
            self.serving -= 1


@pytest.fixture
def dripping() -> Iterator[tuple[Dripping, str]]:
    rec = Dripping()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            rec.enter()
            try:
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                for _ in range(100):  # until the client hangs up
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(TIMEOUT / 5)
            except OSError:
                pass  # the dispatcher gave up on it
            finally:
                rec.leave()

    with serving(Handler) as url:
        yield rec, url


async def test_a_dripping_receiver_is_not_sent_one_delivery_twice_at_once(
    tmp_path: Path, dripping: tuple[Dripping, str]
) -> None:
    rec, url = dripping
    store = open_store(f"sqlite:///{tmp_path / 'hooks.db'}")
    await store.open()
    try:
        await store.transact(
            service_webhooks._insert,
            "evt_r1_1",
            "t1",
            "r1",
            url,
            "run.completed",
            {"id": "evt_r1_1"},
        )
        local = Egress(("127.0.0.1",))  # the receiver is on loopback
        first = Dispatcher(store, timeout=TIMEOUT, backoff=3600, owner="first", egress=local)
        second = Dispatcher(store, timeout=TIMEOUT, backoff=3600, owner="second", egress=local)
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            attempt = asyncio.create_task(first.once(client))
            started = asyncio.create_task(asyncio.to_thread(rec.started.wait, 30))
            await asyncio.wait({attempt, started}, return_when=asyncio.FIRST_COMPLETED)
            if not rec.started.is_set():  # say why the receiver never saw the attempt
                rows = await store.transact(service_webhooks.deliveries)
                tried = attempt.result() if attempt.done() else "unfinished"
                raise AssertionError(f"no request reached the receiver: {tried=} {rows=}")
            await started
            while not attempt.done():  # the other dispatcher polls all along the attempt
                await second.once(client)
                await asyncio.sleep(TIMEOUT / 3)
            assert await attempt == 1
        assert rec.most == 1  # never two sends of the delivery at once
        (row,) = await store.transact(service_webhooks.deliveries)
        assert row["status"] == "pending" and row["attempts"] == 1, row
        assert "Timeout" in (row["last_error"] or ""), row
    finally:
        await store.close()


async def test_a_claimer_whose_clock_runs_ahead_takes_no_live_claim(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        await store.transact(
            service_webhooks._insert,
            "evt_r1_1",
            "t1",
            "r1",
            "http://127.0.0.1:9/",
            "run.completed",
            {},
        )
        now = time.time()
        held = await store.transact(service_webhooks.claim_due, now, 10, 30.0, "on-time")
        assert [r["id"] for r in held] == ["evt_r1_1"]
        ahead = await store.transact(service_webhooks.claim_due, now + 60, 10, 30.0, "fast")
        assert ahead == []  # the claim is live for 30 s by the database's clock
    finally:
        await store.close()
