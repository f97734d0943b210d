"""What the console's pages cost at volume: ``python -m agentledger_bench.console_pages
[--runs N] [--db URL] [--repeat N]`` prints JSON.

Seeds a store (a new SQLite file, or the empty PostgreSQL database ``--db`` names) with
``--runs`` runs of one tenant (most completed, some failed, handed over or waiting; every
tenth with a three-step journal, one step retried; three events each), written in bulk;
then serves the app in process (ASGI, no sockets), signs in once and times each page
``--repeat`` times, interleaved: the runs list's first page, a status filter, a filter
few runs match (retries), a page deep in the list (by its cursor), a run's page, and
the numbers page over 7 and 30 days (every run: per agent, version and day), read from
the daily rollup: the seeded runs are folded into it first, as the workers' background
pass folds runs as they finish (``fold_seconds``).
Figures: the median and p95 time per page in milliseconds, measured around the request
in the same process (the server's time; no network).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agentledger import App
from agentledger import _rollup as rollup
from agentledger.service import ServiceSettings, create_app
from agentledger.service._auth import create_key
from agentledger.service._queries import console as console_queries
from agentledger.service._queries.console import ConsoleFilter
from agentledger.store import Store, open_store
from agentledger_bench.stats import percentile

PEPPER = b"console-bench-pepper-0123456789"
_RUN = (
    "INSERT INTO runs (id, tenant_id, user_id, kind, name, version, target, status, "
    "step_count, tokens, cost_usd, created_at, updated_at, available_at, handover_reason, "
    "event_seq) VALUES (:id, 't1', :user, 'agent', :name, :version, :target, :status, :steps, "
    ":tokens, :cost, :created, :updated, :created, :reason, 3)"
)
_STEP = (
    "INSERT INTO steps (run_id, step_no, kind, name, status, input, output, attempts, "
    "idempotency_key, started_at, duration_ms, lease_epoch, error_class) VALUES (:id, :no, "
    "'tool', :name, 'succeeded', '{\"args\": {}}', '{}', :attempts, :key, :at, 40, 1, :ec)"
)
_EVENT = (
    "INSERT INTO events (run_id, at, type, actor, data, seq) "
    "VALUES (:id, :at, :type, 'bench', :data, :seq)"
)


def _rows(n: int) -> dict[str, list[dict[str, Any]]]:
    now = time.time()
    out: dict[str, list[dict[str, Any]]] = {"runs": [], "steps": [], "events": []}
    for i in range(n):
        status = "completed"
        if i % 50 == 0:
            status = ("failed", "needs_human", "waiting")[i // 50 % 3]
        created = now - 30 * 86400 + i * (30 * 86400 / n)
        run_id = f"r{i:09d}"
        journal = i % 10 == 0
        out["runs"].append({
            # Each agent's version 2 rolled out half way through the month.
            "id": run_id, "user": f"u{i % 20}", "name": f"agent{i % 4}",
            "version": "1" if i < n // 2 else "2", "target": f"agent{i % 4}@1",
            "status": status, "steps": 3 if journal else 0,
            "tokens": i % 5000, "cost": (i % 100) / 1000, "created": created,
            "updated": created + 5, "reason": "rate_limited" if status == "failed" else None,
        })  # fmt: skip
        if journal:
            for no in (1, 2, 3):
                out["steps"].append({
                    "id": run_id, "no": no, "name": f"tool{no}", "key": f"{run_id}:{no}",
                    "attempts": 2 if (no == 2 and i % 1000 == 0) else 1, "at": created + no,
                    "ec": None,
                })  # fmt: skip
        for seq, kind in enumerate(("run.submitted", "run.claimed", f"run.{status}"), start=1):
            out["events"].append({"id": run_id, "at": created + seq, "type": kind,
                                  "data": '{"epoch": 1}', "seq": seq})  # fmt: skip
    return out


def _seed(store: Store, n: int) -> None:
    d = store.dialect
    conn = d.connect()
    try:
        rows = _rows(n)
        d.begin_write(conn)
        for sql, name in ((_RUN, "runs"), (_STEP, "steps"), (_EVENT, "events")):
            for row in rows[name]:
                d.execute(conn, sql, row)
        d.commit(conn)
    finally:
        d.close(conn)


async def _timed(client: httpx.AsyncClient, url: str) -> tuple[float, str]:
    start = time.perf_counter()
    r = await client.get(url)
    ms = (time.perf_counter() - start) * 1000
    if r.status_code != 200:
        raise AssertionError(f"{url}: {r.status_code} {r.text[:300]}")
    return ms, r.text


async def measure(url: str, runs: int, repeat: int) -> dict[str, Any]:
    """Seed the store at ``url`` and time the console's pages on it."""
    store = open_store(url)
    await store.open()
    try:
        await asyncio.to_thread(_seed, store, runs)
        # Written finished and not folded: folded here as the workers' background pass
        # folds runs as they finish (agentledger/_rollup.py), timed.
        began = time.perf_counter()
        folded = await rollup.fold_once(store, max_batches=None)
        fold_seconds = round(time.perf_counter() - began, 1)
        key, _ = await create_key(store, PEPPER, "t1", "bench", ["admin"], 3600)
        # The seeded events are left unsealed: a sealer chaining them would time itself too.
        settings = ServiceSettings(db_url=url, pepper=PEPPER, audit_seal_every=3600)
        app = create_app(settings, App("console-bench"), store=store)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                form = (await client.get("/ui/signin")).text
                token = re.search(r'name="token" value="([^"]+)"', form)
                assert token is not None
                signed = await client.post("/ui/signin", data={"key": key, "token": token.group(1)})
                assert signed.status_code == 303, signed.text
                # A page deep in the list: follow 20 pages' cursors once.
                deep = "/ui/runs"
                for _ in range(20):
                    _, html = await _timed(client, deep)
                    found = re.search(r'href="(/ui/runs\?[^"]*cursor=[^"]+)"', html)
                    assert found is not None
                    deep = found.group(1).replace("&amp;", "&")
                pages = {
                    "runs_first_page": "/ui/runs",
                    "runs_status_failed": "/ui/runs?status=failed",
                    "runs_min_retries_1": "/ui/runs?min_retries=1",
                    "runs_page_21": deep,
                    "run_page": f"/ui/runs/r{runs - 10:09d}",
                    "numbers_7d": "/ui/numbers?since=7d",
                    "numbers_30d": "/ui/numbers?since=30d",
                }
                times: dict[str, list[float]] = {name: [] for name in pages}
                for _ in range(repeat):
                    for name, page in pages.items():
                        times[name].append((await _timed(client, page))[0])
                times.update(await _live_checks(store, runs, repeat))
    finally:
        await store.close()
    out: dict[str, Any] = {"runs": runs, "backend": store.dialect.name, "folded": folded,
                           "fold_seconds": fold_seconds}  # fmt: skip
    for name, values in times.items():
        p95 = percentile(values, 0.95)
        out[name] = {"median_ms": round(statistics.median(values), 1), "p95_ms": round(p95, 1)}
    return out


async def _live_checks(store: Store, runs: int, repeat: int) -> dict[str, list[float]]:
    """What the live list pays per batch of the tenant's events instead of reading its
    page: which of 50 runs the page could take in (``runs_matching``), for the filter
    that makes the page itself the slowest (``min_retries=1``) and for no filter."""
    ids = [f"r{n:09d}" for n in range(runs - 50, runs)]
    out: dict[str, list[float]] = {}
    for name, f in (
        ("live_check_50_ids_min_retries_1", ConsoleFilter("t1", min_retries=1)),
        ("live_check_50_ids_no_filter", ConsoleFilter("t1")),
    ):
        out[name] = []
        for _ in range(repeat):
            start = time.perf_counter()
            await store.read(console_queries.runs_matching, f, ids, None)
            out[name].append((time.perf_counter() - start) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--db", help="an EMPTY database (default: a new SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'console.db'}"
        print(json.dumps(asyncio.run(measure(url, args.runs, args.repeat)), indent=2))


if __name__ == "__main__":
    main()
