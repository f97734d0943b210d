"""A ``serve`` process killed (SIGKILL) after an accept's transaction committed and
before its answer was sent: the client's retry with the same Idempotency-Key, served by
the next process, answers the same run (a replay), never a second run; and the events
the killed process committed unsealed are sealed by the next one into a chain that
verifies."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx

from agentledger.service._auth import create_key
from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from tests.service.conftest import PEPPER, free_port

ROOT = Path(__file__).resolve().parents[2]

SERVE = r"""
import os, signal, sys
import uvicorn
from tests.service import service_app
from tests.service.conftest import settings_for
from agentledger.service import create_app
from agentledger.service._server import uvicorn_config
from agentledger.store._sqlstore import Store
import agentledger.service._accepting as accepting

url, port, die = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "die"
if die:
    accepted = []
    original_accept, original_transact = accepting.accept, Store.transact

    def accept(*args, **kwargs):
        out = original_accept(*args, **kwargs)
        accepted.append(True)
        return out

    async def transact(self, fn, *args, **kwargs):
        out = await original_transact(self, fn, *args, **kwargs)
        if accepted:  # committed, not answered: die now
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    accepting.accept = accept
    Store.transact = transact
settings = settings_for(url)
api = create_app(settings, service_app.app)
uvicorn.Server(uvicorn_config(api, "127.0.0.1", port, settings.client_bounds, "warning")).run()
"""

BODY = {"agent": "echo", "input": {"text": "pay \u00e9 once", "n": -0.0, "f": 1e308}}


def start(url: str, port: int, die: bool, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    with log.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-c", SERVE, url, str(port), "die" if die else "live"],
            cwd=ROOT, env=env, stderr=err,
        )  # fmt: skip


async def ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=2) as client:
        for _ in range(600):
            assert proc.poll() is None, log.read_text()
            try:
                if (await client.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("serve did not start")


async def test_kill_9_between_commit_and_answer_then_the_retry_replays(
    store_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    store = open_store(store_url)
    await store.open()  # migrates
    try:
        full, _ = await create_key(store, PEPPER, "t1", "alice", ["operator"], 3600)
        headers = {"Authorization": f"Bearer {full}", "Idempotency-Key": "pay-once-\u0041"}
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        dying = start(store_url, port, True, log)
        try:
            await ready(base, dying, log)
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                try:
                    lost = await client.post("/v1/runs", json=BODY, headers=headers)
                except httpx.TransportError:
                    lost = None
            assert lost is None, lost.text  # no answer: the process died first
            assert dying.wait(timeout=30) == -9
        finally:
            if dying.poll() is None:
                dying.kill()
            dying.wait()
        runs = await store.read(lambda tx: tx.fetchall("SELECT id, input FROM runs"))
        assert len(runs) == 1  # committed before the kill
        live = start(store_url, port, False, log)
        try:
            await ready(base, live, log)
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                retry = await client.post("/v1/runs", json=BODY, headers=headers)
                again = await client.post("/v1/runs", json=BODY, headers=headers)
                other = await client.post(
                    "/v1/runs", json={**BODY, "input": {"text": "other"}}, headers=headers
                )
        finally:
            live.terminate()
            live.wait(timeout=30)
        assert retry.status_code == 202, retry.text
        assert retry.headers.get("Idempotent-Replayed") == "true"
        assert retry.json()["id"] == runs[0]["id"]
        assert again.content == retry.content  # byte for byte
        assert other.status_code == 422, other.text
        assert other.json()["type"].endswith("idempotency-key-reused")
        count = await store.read(lambda tx: tx.fetchall("SELECT COUNT(*) AS n FROM runs"))
        assert count[0]["n"] == 1
        await store.transact(service_audit.seal)
        checked, broken = await store.read(lambda tx: service_audit.verify_chain(tx))
        assert broken == [] and checked >= 2
    finally:
        await store.close()
