"""A worker SIGKILLed with no replacement: a live worker of another version reports the
run stuck after the (short) threshold -- by its metric, one ``run.stuck`` event and a
signed webhook (issue 11, item 4, with real worker processes)."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentledger.records import RunStatus
from agentledger.service._egress import Egress
from agentledger.service._queries import audit as service_audit
from agentledger.service._queries import webhooks as service_webhooks
from agentledger.service._webhooks import Dispatcher, verify
from agentledger.store import open_store
from tests.engine.helpers import APP_V2, Env, wait_for
from tests.observe.test_stuck_metrics import samples, value

HOOK = "https://hooks.example.test/agentledger"
PUBLIC = "93.184.216.34"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    monkeypatch.setenv("AGENTLEDGER_STUCK_AFTER", "1.5")
    monkeypatch.setenv("AGENTLEDGER_STUCK_CHECK", "0.1")
    world = Env(tmp_path)
    yield world
    world.close()


def _metrics_port(env: Env, n: int) -> int:
    def port() -> int | None:
        found = re.search(r"metrics on http://[^:]+:(\d+)/metrics", env.worker_log(n))
        return int(found.group(1)) if found else None

    return wait_for(port, 30, f"worker {n}'s metrics port")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


async def _webhooks(url: str, run_id: str) -> tuple[list[dict], list[httpx.Request]]:
    """Seal the events (enqueueing their webhooks) and deliver what is due."""
    store = open_store(url)
    await store.open()
    seen: list[httpx.Request] = []

    def receive(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    try:
        await store.transact(service_audit.seal)
        rows = await store.transact(service_webhooks.deliveries, run_id)
        async with httpx.AsyncClient(transport=httpx.MockTransport(receive)) as client:
            # The name answers with a public address (tests resolve no real names).
            egress = Egress(hosts={"hooks.example.test": [PUBLIC]})
            await Dispatcher(store, egress=egress).once(client)
        secret = await store.transact(service_webhooks.webhook_secret, "default")
    finally:
        await store.close()
    for request in seen:
        assert verify(secret, request.headers["AgentLedger-Signature"], request.content)
    return rows, seen


def test_a_killed_worker_with_no_replacement_is_reported_stuck(env: Env) -> None:
    flag = env.hold_flag("stuck")
    hold = {"item": "i2", "phase": "after_effect", "flag": str(flag)}
    run_id = env.submit("five_writes", {"hold": hold})
    with sqlite3.connect(env.db_path) as conn:  # as `POST /v1/runs` with a webhook stores it
        conn.execute("UPDATE runs SET webhook = ? WHERE id = ?", (HOOK, run_id))
    # The test delivers the webhooks itself (below), so its workers do not.
    first = env.start_worker(lease=1.0, extra=("--no-webhooks",))
    env.wait_marker(flag)
    env.kill(first)  # mid-run, no replacement for its version
    # A live worker of another version: it cannot take the run over, but it watches.
    env.start_worker(app=APP_V2, lease=1.0, extra=("--metrics-port", "0", "--no-webhooks"))
    port = _metrics_port(env, 2)

    def reported() -> list:
        return [e for e in env.events(run_id) if e.type == "run.stuck"]

    events = wait_for(reported, 60, "the run to be reported stuck", 0.1)
    assert len(events) == 1
    event = events[0]
    assert event.data["reason"] == "no_progress" and event.data["status"] == RunStatus.RUNNING
    assert event.data["idle_seconds"] >= 1.5 and event.data["agent"] == "five_writes"
    found = samples(_scrape(port))
    assert value(found, "agentledger_stuck_runs", agent="five_writes", reason="no_progress") == 1
    assert value(found, "agentledger_stuck_reported_total", reason="no_progress") == 1
    assert env.run(run_id).status == RunStatus.RUNNING  # nobody took the run over
    rows, delivered = asyncio.run(_webhooks(env.url, run_id))
    stuck = [r for r in rows if r["type"] == "run.stuck"]
    assert len(stuck) == 1 and stuck[0]["url"] == HOOK
    posts = [r for r in delivered if r.headers["AgentLedger-Event"] == "run.stuck"]
    assert len(posts) == 1 and str(posts[0].url) == f"https://{PUBLIC}/agentledger"
    assert posts[0].headers["Host"] == "hooks.example.test"  # pinned, for the URL's host
    assert posts[0].extensions["sni_hostname"] == "hooks.example.test"
    assert posts[0].headers["Connection"] == "close"  # no pooled TLS shared across names
    assert b'"reason":"no_progress"' in posts[0].content.replace(b" ", b"")
    assert len(reported()) == 1
