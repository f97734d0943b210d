"""The sandbox as a process: persistence across restarts, crashes, killed clients, CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentledger_examples.stayhub.sandbox import SandboxServer, serve

STAY: dict[str, Any] = {
    "hotel_id": "h-por-1",
    "guest_id": "g-7",
    "check_in": "2031-07-01",
    "nights": 1,
}


def wait_for_status(
    client: httpx.Client, key: str, wanted: str, within: float = 5.0
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        body: dict[str, Any] = client.get(f"/bookings/by-key/{key}").json()
        if body["status"] == wanted or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def test_restart_keeps_ledger_idempotency_and_inventory(tmp_path: Path) -> None:
    ledger_file = str(tmp_path / "stayhub.db")
    params = {"check_in": STAY["check_in"], "nights": 1}
    with SandboxServer(ledger_path=ledger_file, faults="search:error,count=1") as sb:
        url = sb.url
        with httpx.Client(base_url=sb.url, trust_env=False, timeout=5) as client:
            assert client.get("/hotels", params={"city": "Porto"}).status_code == 503  # CLI spec
            rooms = client.get("/hotels/h-por-1/availability", params=params).json()["rooms_left"]
            first = client.post("/bookings", json=STAY, headers={"Idempotency-Key": "r:1"})
            assert first.status_code == 201
        before = sb.ledger()

        sb.restart()
        assert sb.url == url and Path(ledger_file).exists()
        assert sb.ledger() == before
        with httpx.Client(base_url=sb.url, trust_env=False, timeout=5) as client:
            replay = client.post("/bookings", json=STAY, headers={"Idempotency-Key": "r:1"})
            assert replay.headers["idempotent-replayed"] == "true"
            assert replay.json() == first.json()
            left = client.get("/hotels/h-por-1/availability", params=params).json()["rooms_left"]
            assert left == rooms - 1
            assert client.get("/hotels", params={"city": "Porto"}).status_code == 503  # re-armed

        sb.restart(hard=True)  # SIGKILL: committed effects survive a crash too
        assert sb.ledger() == before


async def test_sandbox_killed_while_holding_forgets_the_unapplied_request() -> None:
    with SandboxServer(faults="bookings.create:hold,hold=5") as sb:
        async with httpx.AsyncClient(base_url=sb.url, trust_env=False, timeout=10) as client:
            headers = {"Idempotency-Key": "crash:1"}
            request = asyncio.create_task(client.post("/bookings", json=STAY, headers=headers))
            for _ in range(100):
                if (await client.get("/bookings/by-key/crash:1")).json()["status"] == "pending":
                    break
                await asyncio.sleep(0.05)
            sb.kill()
            with pytest.raises(httpx.TransportError):
                await request
        sb.restart(faults="")
        assert sb.ledger() == []
        with httpx.Client(base_url=sb.url, trust_env=False, timeout=5) as sync:
            assert sync.get("/bookings/by-key/crash:1").json() == {"status": "not_found"}
            assert sync.post("/bookings", json=STAY, headers=headers).status_code == 201
            assert wait_for_status(sync, "crash:1", "succeeded")["status"] == "succeeded"
        assert [e["idempotency_key"] for e in sb.ledger()] == ["crash:1"]


def test_killed_client_mid_request_still_applies_once(sb: SandboxServer) -> None:
    sb.set_faults("bookings.create:hold,hold=0.8")
    script = (
        "import httpx, json, sys\n"
        "httpx.post(sys.argv[1] + '/bookings', json=json.loads(sys.argv[2]),\n"
        "           headers={'Idempotency-Key': 'gone:1'}, trust_env=False, timeout=30)\n"
    )
    client_proc = subprocess.Popen([sys.executable, "-c", script, sb.url, json.dumps(STAY)])
    try:
        with httpx.Client(base_url=sb.url, trust_env=False, timeout=5) as client:
            assert wait_for_status(client, "gone:1", "pending")["status"] == "pending"
            client_proc.kill()
            client_proc.wait()
            done = wait_for_status(client, "gone:1", "succeeded")
            assert done["status"] == "succeeded"
            sb.clear_faults()
            retry = client.post("/bookings", json=STAY, headers={"Idempotency-Key": "gone:1"})
            assert retry.headers["idempotent-replayed"] == "true"
    finally:
        if client_proc.poll() is None:
            client_proc.kill()
            client_proc.wait()
    assert [e["idempotency_key"] for e in sb.ledger()] == ["gone:1"]


def test_cli_rejects_a_bad_fault_spec() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentledger_examples.stayhub.sandbox",
            "--port",
            "1",
            "--faults",
            "search:boom",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "bad fault spec: unknown fault kind 'boom'" in result.stderr
    assert "example:" in result.stderr


def test_serve_refuses_non_loopback_hosts() -> None:
    with pytest.raises(ValueError, match="loopback"):
        serve("0.0.0.0", 8700, None, None)
