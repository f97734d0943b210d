"""``agentledger bench --api``: the HTTP service under load, from another process.

One ``serve`` process (a subprocess, on loopback) and this process as the load
generator: accepted ``POST /v1/runs`` per second and p50/p99 latency, without and with
Idempotency-Key; then SSE lag -- from an event's insert time to its arrival at a
client -- with ``streams`` open streams while a worker subprocess runs the runs.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agentledger import App, WorkflowContext
from agentledger.store import open_store

app = App("api-bench")


async def _tick() -> str:
    return "ok"


@app.workflow(name="noop", version="1")
async def noop(ctx: WorkflowContext, input: Any) -> Any:
    """``steps`` journaled no-op steps."""
    steps = int(input.get("steps", 0)) if isinstance(input, dict) else 0
    for i in range(steps):
        await ctx.step(f"s{i}", _tick)
    return {"ok": True}


APP_PATH = "agentledger.service.bench:app"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient(base_url=base) as client:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError("serve exited; see its output above")
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError("serve did not become ready in 30 s")


async def _load(
    base: str, headers: dict[str, str], total: int, concurrency: int, idempotent: bool
) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            h = dict(headers)
            if idempotent:
                h["Idempotency-Key"] = f"bench-{secrets.token_hex(6)}-{i}"
            start = time.perf_counter()
            r = await client.post("/v1/runs", json={"agent": "noop", "input": {}}, headers=h)
            latencies.append((time.perf_counter() - start) * 1000)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        began = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return {
        "requests": total,
        "concurrency": concurrency,
        "accepted_per_s": round(statuses.get(202, 0) / elapsed, 1),
        "p50_ms": round(_pct(latencies, 0.50), 2),
        "p99_ms": round(_pct(latencies, 0.99), 2),
        "statuses": statuses,
    }


async def _sse_lag(
    base: str, headers: dict[str, str], streams: int, env: dict[str, str], db: str
) -> dict[str, Any]:
    lags: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        ids = []
        for _ in range(streams):
            body = {"agent": "noop", "input": {"steps": 5}}
            ids.append((await client.post("/v1/runs", json=body, headers=headers)).json()["id"])
        opened = asyncio.Event()
        count = 0

        async def follow(run_id: str) -> None:
            nonlocal count
            async with client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as r:
                count += 1
                if count == streams:
                    opened.set()
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        import json

                        event = json.loads(line[6:])
                        if event.get("at") and event["type"].startswith("step."):
                            lags.append((time.time() - float(event["at"])) * 1000)

        tasks = [asyncio.create_task(follow(i)) for i in ids]
        await asyncio.wait_for(opened.wait(), 60)
        worker = subprocess.Popen(
            [sys.executable, "-m", "agentledger.cli.main", "worker", "--app", APP_PATH,
             "--db", db, "--poll-seconds", "0.05"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), 300)
        finally:
            worker.terminate()
            worker.wait(30)
    return {
        "streams": streams,
        "events": len(lags),
        "lag_p50_ms": round(_pct(lags, 0.5), 2),
        "lag_p95_ms": round(_pct(lags, 0.95), 2),
    }


async def run_api_bench(
    db: str | None, requests: int = 2000, concurrency: int = 32, streams: int = 100
) -> dict[str, Any]:
    """Start ``serve`` on ``db`` (default: a temporary SQLite file in the current
    directory, on the same disk as the default database), load it, stop it."""
    if db is None:
        with tempfile.TemporaryDirectory(prefix="agentledger-api-bench-", dir=".") as tmp:
            return await run_api_bench(
                f"sqlite:///{Path(tmp) / 'bench.db'}", requests, concurrency, streams
            )
    pepper = secrets.token_hex(16)
    env = dict(os.environ, AGENTLEDGER_KEY_PEPPER=pepper)
    store = open_store(db)
    await store.open()
    try:
        from agentledger.service.auth import create_key

        key, _ = await create_key(store, pepper.encode(), "bench", "bench", ["operator"], 3600)
    finally:
        await store.close()
    port = _port()
    base = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [sys.executable, "-m", "agentledger.cli.main", "serve", "--app", APP_PATH, "--db", db,
         "--port", str(port), "--log-level", "warning"],
        env=env,
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    try:
        await _wait_ready(base, serve)
        await _load(base, headers, min(200, requests), concurrency, False)  # warm-up
        plain = await _load(base, headers, requests, concurrency, False)
        keyed = await _load(base, headers, requests, concurrency, True)
        lag = await _sse_lag(base, headers, streams, env, db)
    finally:
        serve.terminate()
        serve.wait(30)
    return {
        "backend": db.split(":", 1)[0],
        "cpus": os.cpu_count(),
        "post_runs": plain,
        "post_runs_idempotency_key": keyed,
        "sse": lag,
    }
