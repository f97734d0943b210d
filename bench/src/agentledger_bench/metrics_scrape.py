"""What one ``/metrics`` scrape costs at volume: ``python -m agentledger_bench.metrics_scrape
[--runs N] [--db URL] [--scrapes N]`` prints JSON.

Seeds a store (a new SQLite file, or the empty PostgreSQL database ``--db`` names) with
``--runs`` runs, 97 % finished and the rest queued, running or waiting, one outbox row
and two audit events per run (plus a budget handover and an unknown outcome now and
then), written in bulk. Then, in one process, interleaved (a scrape of each condition
per repetition, so the noise of a shared machine hits both alike):

- ``every_scrape``: the settled history read by every scrape
  (``AGENTLEDGER_METRICS_REFRESH=0``, what each scrape cost before the history was cached);
- ``cached``: the default: a scrape reads the live part; the history is read by the
  process's first scrape (``first_ms``) and again in the background once a minute.

Figures: the median and the worst scrape time per condition, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentledger.observe._metrics import StoreFigures, render_metrics
from agentledger.observe._stuck import StuckPolicy
from agentledger.store import Store, open_store

_RUN = (
    "INSERT INTO runs (id, tenant_id, kind, name, version, target, status, tokens, cost_usd, "
    "created_at, updated_at, available_at) VALUES (:id, :tenant, 'agent', :name, '1', "
    ":target, :status, :tokens, :cost, :created, :updated, :now)"
)
_OUTBOX = (
    "INSERT INTO outbox (key, run_id, step_no, tool, payload, attempts, next_attempt_at, "
    "status, created_at, updated_at) VALUES (:key, :id, 1, 'email', '{}', 1, :now, :status, "
    ":now, :now)"
)
_EVENT = (
    "INSERT INTO events (run_id, at, type, actor, data, seq) "
    "VALUES (:id, :now, :type, 'bench', :data, :seq)"
)


def _rows(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    rng, now = random.Random(1), time.time()
    runs, outbox, events = [], [], []
    for i in range(n):
        status = "completed" if i % 50 else rng.choice(["failed", "needs_human", "cancelled"])
        if i >= n - n // 33:
            status = rng.choice(["queued", "running", "waiting"])
        created = now - 30 * 86400 + i * (30 * 86400 / n)
        run_id = f"r{i:09d}"
        runs.append({
            "id": run_id, "tenant": f"t{i % 5}", "name": f"agent{i % 4}",
            "target": f"agent{i % 4}@1", "status": status, "tokens": rng.randint(0, 5000),
            "cost": rng.random() / 10, "created": created, "updated": created + 5, "now": now,
        })  # fmt: skip
        outbox.append({"key": f"k{i}", "id": run_id, "now": now,
                       "status": "delivered" if i % 100 else "pending"})  # fmt: skip
        for seq, kind in enumerate(("run.started", "tool.executed"), start=1):
            events.append({"id": run_id, "now": now, "type": kind, "data": "{}", "seq": seq})
        if i % 97 == 0:
            data = '{"reason": "budget", "detail": "steps 10"}'
            events.append({"id": run_id, "now": now, "type": "run.handover", "data": data,
                           "seq": 3})  # fmt: skip
        if i % 89 == 0:
            events.append({"id": run_id, "now": now, "type": "tool.unknown_outcome",
                           "data": "{}", "seq": 4})  # fmt: skip
    return runs, outbox, events


def _seed(store: Store, n: int) -> None:
    d = store.dialect
    conn = d.connect()
    try:
        runs, outbox, events = _rows(n)
        d.begin_write(conn)
        for sql, rows in ((_RUN, runs), (_OUTBOX, outbox), (_EVENT, events)):
            for row in rows:
                d.execute(conn, sql, row)
        d.commit(conn)
    finally:
        d.close(conn)


async def _scrape_ms(store: Store, figures: StoreFigures, policy: StuckPolicy) -> float:
    start = time.perf_counter()
    await render_metrics(store, policy, process=False, figures=figures)
    return (time.perf_counter() - start) * 1000


async def measure(url: str, runs: int, scrapes: int) -> dict[str, Any]:
    """Seed the store at ``url`` and time scrapes of both conditions."""
    store = open_store(url)
    await store.open()
    try:
        await asyncio.to_thread(_seed, store, runs)
        policy = StuckPolicy(after=3600)
        every, cached = StoreFigures(refresh=0), StoreFigures(refresh=60)
        first = await _scrape_ms(store, cached, policy)
        times: dict[str, list[float]] = {"every_scrape": [], "cached": []}
        for _ in range(scrapes):
            times["every_scrape"].append(await _scrape_ms(store, every, policy))
            times["cached"].append(await _scrape_ms(store, cached, policy))
    finally:
        await store.close()
    out: dict[str, Any] = {"runs": runs, "backend": store.dialect.name, "first_ms": first}
    for name, values in times.items():
        out[name] = {"median_ms": statistics.median(values), "max_ms": max(values)}
    out["ratio"] = out["every_scrape"]["median_ms"] / out["cached"]["median_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--scrapes", type=int, default=15)
    parser.add_argument("--db", help="an EMPTY database (default: a new SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'scrape.db'}"
        print(json.dumps(asyncio.run(measure(url, args.runs, args.scrapes)), indent=2))


if __name__ == "__main__":
    main()
