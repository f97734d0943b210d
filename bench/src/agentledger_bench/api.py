"""``agentledger bench --api``: the HTTP service under load, from another process.

One ``serve`` process (a subprocess, on loopback) and this process as the load
generator. ``POST /v1/runs``, without and with Idempotency-Key, is measured two ways:

* **closed loop** (``post_runs*``): ``concurrency`` clients each send their next request
  as soon as the last one is answered. This finds the saturation throughput; latency
  there is mostly queueing (about concurrency / throughput), not service time.
* **fixed rate** (``post_runs_at_rate*``, open loop, as wrk2 does): requests are
  scheduled ``1/rate`` apart whatever the answers do, and each one's latency runs from
  its *scheduled* send time, so a stall is charged to every request it held back
  (no coordinated omission). This answers "at 1,000 runs/s, what is the p99?".

And SSE lag -- from an event's insert time to its arrival at a client -- with
``streams`` open streams while a worker subprocess runs the runs (measured after the
closed-loop phases, before the fixed-rate ones).

The load generator is aiohttp's client (a dependency of this package): httpx
spent 2.4-2.7 ms of CPU per request here against aiohttp's 0.14-0.16 ms, and on two
cores the generator shares the CPU with the server. Each load phase also reports the CPU
time the server and the generator spent per request (Linux), so a missed target shows
where the limit is.
"""

from __future__ import annotations

import asyncio
import json
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
from agentledger import _heap as heap
from agentledger.errors import UsageError
from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from agentledger_bench.stats import percentile

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


APP_PATH = "agentledger_bench.api:app"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _aiohttp() -> Any:
    try:
        import aiohttp
    except ImportError:
        raise UsageError(
            "the API benchmark's load generator needs aiohttp: pip install -e ./bench"
        ) from None
    return aiohttp


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


async def _load(
    base: str,
    headers: dict[str, str],
    total: int,
    concurrency: int,
    idempotent: bool,
    server_pid: int | None = None,
) -> dict[str, Any]:
    aiohttp = _aiohttp()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    left = iter(range(total))
    body = {"agent": "noop", "input": {}}

    async def client_loop(session: Any) -> None:
        for i in left:
            h = dict(headers)
            if idempotent:
                h["Idempotency-Key"] = f"bench-{secrets.token_hex(6)}-{i}"
            start = time.perf_counter()
            async with session.post("/v1/runs", json=body, headers=h) as r:
                await r.read()
            latencies.append((time.perf_counter() - start) * 1000)
            statuses[r.status] = statuses.get(r.status, 0) + 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    heap.freeze_startup()  # as in _fixed_rate
    async with aiohttp.ClientSession(base, connector=connector, timeout=timeout) as session:
        server_before = _cpu_seconds(server_pid) if server_pid else None
        own_before = _own_cpu_seconds()
        began = time.perf_counter()
        await asyncio.gather(*(client_loop(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
        own = _own_cpu_seconds() - own_before
        server_after = _cpu_seconds(server_pid) if server_pid else None
    out: dict[str, Any] = {
        "requests": total,
        "concurrency": concurrency,
        "accepted_per_s": round(statuses.get(202, 0) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.50), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "statuses": statuses,
        "load_generator_cpu_ms_per_request": round(own * 1000 / total, 3),
    }
    if server_before is not None and server_after is not None:
        out["server_cpu_ms_per_request"] = round((server_after - server_before) * 1000 / total, 3)
    return out


async def _fixed_rate(
    base: str,
    headers: dict[str, str],
    rate: float,
    seconds: float,
    connections: int,
    idempotent: bool,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """Offer ``rate`` requests per second for ``seconds`` (open loop) and time each one
    from its scheduled send time: a request the generator or a busy connection pool
    held back is charged the wait, as wrk2 does."""
    aiohttp = _aiohttp()
    total = max(1, round(rate * seconds))
    latencies: list[float] = []  # answered requests, from their scheduled send time
    late: list[float] = []  # how far behind its schedule each request left the generator
    statuses: dict[int, int] = {}
    failures: dict[str, int] = {}  # requests without an answer, by exception
    body = json.dumps({"agent": "noop", "input": {}}).encode()
    plain = {**headers, "Content-Type": "application/json"}
    last_answer = 0.0

    async def one(session: Any, i: int, scheduled: float) -> None:
        nonlocal last_answer
        h = plain
        if idempotent:
            h = {**plain, "Idempotency-Key": f"bench-{secrets.token_hex(6)}-{i}"}
        late.append((time.perf_counter() - scheduled) * 1000)
        try:
            async with session.post("/v1/runs", data=body, headers=h) as r:
                await r.read()
                status = r.status
        except Exception as exc:  # a timeout, a reset: counted, never retried
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
            return
        now = time.perf_counter()
        last_answer = max(last_answer, now)
        latencies.append((now - scheduled) * 1000)
        statuses[status] = statuses.get(status, 0) + 1

    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=60)
    # The generator's own heap (the earlier phases' streams and results) out of the
    # collector's reach: a full collection of it stopped this process for 50-65 ms in
    # the middle of a phase, and every request scheduled meanwhile was charged for it.
    heap.freeze_startup()
    async with aiohttp.ClientSession(base, connector=connector, timeout=timeout) as session:
        server_before = _cpu_seconds(server_pid) if server_pid else None
        own_before = _own_cpu_seconds()
        tasks = []
        start = time.perf_counter()
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            # Everything already due leaves now, however late: the schedule never slips.
            tasks.append(asyncio.create_task(one(session, i, scheduled)))
        last_sent = time.perf_counter()
        await asyncio.gather(*tasks)
        own = _own_cpu_seconds() - own_before
        server_after = _cpu_seconds(server_pid) if server_pid else None
    accepted = statuses.get(202, 0)
    elapsed = max(last_answer, last_sent) - start
    out: dict[str, Any] = {
        "target_per_s": rate,
        "seconds": seconds,
        "requests": total,
        "connections": connections,
        # Accepted runs over the time from the first scheduled send to the last answer:
        # below the target when the server (or the generator) fell behind.
        "accepted_per_s": round(accepted / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": round(percentile(latencies, 0.50), 2),
        "p90_ms": round(percentile(latencies, 0.90), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2) if latencies else float("nan"),
        "errors": total - accepted,
        "statuses": statuses,
        "failures": failures,
        # The generator's own punctuality: large values mean the figures above measure
        # the generator's CPU, not the server.
        "send_late_p99_ms": round(percentile(late, 0.99), 2),
        "load_generator_cpu_ms_per_request": round(own * 1000 / total, 3),
    }
    if server_before is not None and server_after is not None:
        out["server_cpu_ms_per_request"] = round((server_after - server_before) * 1000 / total, 3)
    return out


async def _wait_sealed(db: str, timeout: float = 120.0, still: float = 3.0) -> None:
    """Wait until nothing is left to seal, or the backlog stopped shrinking for ``still``
    seconds, or ``timeout``."""
    store = open_store(db)
    await store.open()
    try:
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            left, _ = await store.read(service_audit.unsealed_tail)
            if left == 0:
                return
            if left != last:
                last, since = left, time.monotonic()
            elif time.monotonic() - since > still:
                return
            await asyncio.sleep(0.2)
    finally:
        await store.close()


async def _sse_lag(
    base: str, headers: dict[str, str], streams: int, env: dict[str, str], db: str
) -> dict[str, Any]:
    aiohttp = _aiohttp()
    lags: list[float] = []
    connector = aiohttp.TCPConnector(limit=streams + 10)
    timeout = aiohttp.ClientTimeout(total=300)
    heap.freeze_startup()  # as in _fixed_rate
    async with aiohttp.ClientSession(base, connector=connector, timeout=timeout) as client:
        ids = []
        for _ in range(streams):
            body = {"agent": "noop", "input": {"steps": 5}}
            async with client.post("/v1/runs", json=body, headers=headers) as r:
                ids.append((await r.json())["id"])
        opened = asyncio.Event()
        count = 0

        async def follow(run_id: str) -> None:
            nonlocal count
            async with client.get(f"/v1/runs/{run_id}/events", headers=headers) as r:
                count += 1
                if count == streams:
                    opened.set()
                async for raw in r.content:
                    if raw.startswith(b"data: "):
                        event = json.loads(raw[6:])
                        if event.get("at") and event["type"].startswith("step."):
                            lags.append((time.time() - float(event["at"])) * 1000)

        tasks = [asyncio.create_task(follow(i)) for i in ids]
        await asyncio.wait_for(opened.wait(), 60)
        worker = subprocess.Popen(
            [sys.executable, "-m", "agentledger.cli._main", "worker", "--app", APP_PATH,
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
        "lag_p50_ms": round(percentile(lags, 0.5), 2),
        "lag_p95_ms": round(percentile(lags, 0.95), 2),
    }


async def run_api_bench(
    db: str | None,
    requests: int = 2000,
    concurrency: int = 32,
    streams: int = 100,
    rate: float = 1000.0,
    rate_seconds: float = 5.0,
    connections: int = 64,
) -> dict[str, Any]:
    """Start ``serve`` on ``db`` (default: a temporary SQLite file in the current
    directory, on the same disk as the default database), load it, stop it.

    Closed loop: ``requests`` requests from ``concurrency`` clients. Fixed rate (skipped
    when ``rate`` is 0): ``rate`` requests/s for ``rate_seconds`` over at most
    ``connections`` connections. SSE: ``streams`` open streams."""
    if db is None:
        with tempfile.TemporaryDirectory(prefix="agentledger-api-bench-", dir=".") as tmp:
            return await run_api_bench(
                f"sqlite:///{Path(tmp) / 'bench.db'}", requests, concurrency, streams,
                rate, rate_seconds, connections,
            )  # fmt: skip
    pepper = secrets.token_hex(16)
    env = dict(os.environ, AGENTLEDGER_KEY_PEPPER=pepper)
    store = open_store(db)
    await store.open()
    try:
        from agentledger.service._auth import create_key

        key, _ = await create_key(store, pepper.encode(), "bench", "bench", ["operator"], 3600)
        # The streamed runs belong to another tenant: claims are fair across tenants, so
        # the worker reaches them without first draining the load phases' queued runs.
        sse_key, _ = await create_key(
            store, pepper.encode(), "bench-sse", "bench", ["operator"], 3600
        )
    finally:
        await store.close()
    port = _port()
    base = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [sys.executable, "-m", "agentledger.cli._main", "serve", "--app", APP_PATH, "--db", db,
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        env=env,
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    try:
        await _wait_ready(base, serve)
        await _load(base, headers, min(200, requests), concurrency, False)  # warm-up
        plain = await _load(base, headers, requests, concurrency, False, serve.pid)
        keyed = await _load(base, headers, requests, concurrency, True, serve.pid)
        # SSE before the fixed-rate phases: its worker claims among the queued runs, and
        # on PostgreSQL a claim slows down with every queued run the phases leave.
        sse_headers = {"Authorization": f"Bearer {sse_key}"}
        lag = await _sse_lag(base, sse_headers, streams, env, db)
        at_rate: dict[str, Any] = {}
        if rate > 0:
            for name, idempotent in (
                ("post_runs_at_rate", False),
                ("post_runs_at_rate_idempotency_key", True),
            ):
                # Let the sealer catch up on the previous phases' events first (the SSE
                # phase's worker ran queued runs, whose events `serve` seals), so a phase
                # does not pay for the one before it.
                await asyncio.sleep(1.0)
                await _wait_sealed(db)
                at_rate[name] = await _fixed_rate(
                    base, headers, rate, rate_seconds, connections, idempotent, serve.pid
                )
    finally:
        serve.terminate()
        serve.wait(30)
    return {
        "backend": db.split(":", 1)[0],
        "cpus": os.cpu_count(),
        "post_runs": {"mode": "closed loop", **plain},
        "post_runs_idempotency_key": {"mode": "closed loop", **keyed},
        **{k: {"mode": "fixed rate, latency from scheduled send", **v} for k, v in at_rate.items()},
        "sse": lag,
    }
