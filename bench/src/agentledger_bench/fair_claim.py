"""What one fair claim costs with a big backlog: ``python -m agentledger_bench.fair_claim
[--db URL] [--runs 50000] [--claims 10] [--limit 50] [--tenants 10000] [--json]``.

Seeds a store (a new SQLite file, or the EMPTY database ``--db`` names) with ``--runs``
due queued runs, written in bulk (COPY on PostgreSQL), in three shapes, one after the
other in the same database:

- ``one_tenant``: every run belongs to one tenant;
- ``big_plus_100``: one tenant holds 90 % of the runs, 100 small tenants share the rest;
- ``many_tenants``: ``--tenants`` tenants with one due run each (the claim's cost per
  tenant, whatever the backlog);
- ``few_due``: ``--tenants`` tenants with one run parked for an hour (waiting, not due)
  and 20 due runs of 5 tenants (a lightly loaded queue, what most polls meet).

Each claim of ``--limit`` runs goes through the store's claim path (``claim_runs``, what
a worker calls); the claimed runs are put back as they were (queued, no lease, the same
``available_at``) before the next claim, so every claim meets the same backlog.

Two conditions are timed, interleaved (one claim of each per repetition, so the noise of
a shared machine hits both alike):

- ``claim``: the store's claim statement;
- ``full_rank``: the same claim ranking the whole backlog with one window function (the
  statement both backends used before they read each tenant's first runs by index).

Figures: median and p95 per condition, in milliseconds, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentledger.records import RunStatus
from agentledger.store import Store, open_store
from agentledger.store._dialect import Dialect
from agentledger.store._queries.common import RUN_COLUMNS
from agentledger.store._tx import Tx

TARGET = "bench_fair@1"
SHAPES = ("one_tenant", "big_plus_100", "many_tenants", "few_due")
_COLUMNS = (
    "id",
    "tenant_id",
    "kind",
    "name",
    "version",
    "target",
    "input",
    "status",
    "created_at",
    "updated_at",
    "available_at",
)


def full_rank_claim_sql(d: Dialect, n_targets: int) -> str:
    """The claim that ranks every due run of every tenant (the reference)."""
    now = d.now_sql
    update = (
        f"UPDATE runs{{alias}} SET status = '{RunStatus.RUNNING}', lease_owner = :owner, "
        "write_token = :token, lease_epoch = {r}lease_epoch + 1, "
        f"lease_expires_at = {now} + :lease, updated_at = {now}, "
        "event_seq = {r}event_seq + 1, "
        f"resumes = {{r}}resumes + (CASE WHEN {{r}}status = '{RunStatus.RUNNING}' THEN 1 "
        "ELSE 0 END) "
    )
    if d.name == "postgres":
        returning = ", ".join(f"r.{c.strip()}" for c in RUN_COLUMNS.split(","))
        return (
            "WITH k AS (SELECT id, available_at, ROW_NUMBER() OVER "
            "(PARTITION BY tenant_id ORDER BY available_at) AS fair_rank FROM runs "
            f"WHERE {d.claimable(n_targets)}), "
            "c AS (SELECT runs.id FROM runs JOIN k ON k.id = runs.id "
            f"WHERE {d.claimable(n_targets, 'runs')} ORDER BY k.fair_rank, k.available_at "
            "LIMIT :limit FOR UPDATE OF runs SKIP LOCKED) "
            + update.format(alias=" r", r="r.")
            + f"FROM c WHERE r.id = c.id RETURNING {returning}, r.event_seq"
        )
    return (
        update.format(alias="", r="")
        + "WHERE id IN (SELECT id FROM (SELECT id, available_at, ROW_NUMBER() OVER "
        "(PARTITION BY tenant_id ORDER BY available_at) AS fair_rank FROM runs "
        f"WHERE {d.claimable(n_targets)}) WHERE fair_rank <= :limit "
        f"ORDER BY fair_rank, available_at LIMIT :limit) RETURNING {RUN_COLUMNS}, event_seq"
    )


def shape_rows(shape: str, runs: int, tenants: int, now: float) -> Iterator[tuple[Any, ...]]:
    """The rows of one shape: due queued runs, oldest first within each tenant."""
    if shape == "one_tenant":
        owners = ["big"] * runs
    elif shape == "big_plus_100":
        big = runs * 9 // 10
        owners = ["big"] * big + [f"small{i % 100:03d}" for i in range(runs - big)]
    elif shape == "few_due":
        for i in range(tenants):  # parked: waiting, due in an hour
            yield (f"p{i:08d}", f"t{i:06d}", "workflow", "bench_fair", "1", TARGET, "{}",
                   RunStatus.WAITING, now, now, now + 3600)  # fmt: skip
        owners = [f"a{i % 5}" for i in range(20)]
    else:
        owners = [f"t{i:06d}" for i in range(tenants)]
    # Submitted over time by every tenant at once: tenants interleave in the table as
    # they would in production (rows in available_at order, tenants shuffled).
    random.Random(7).shuffle(owners)
    n = len(owners)
    for i, tenant in enumerate(owners):
        at = now - 3600 + i * (3000 / n)  # all due, spread over the last hour
        yield (f"r{i:08d}", tenant, "workflow", "bench_fair", "1", TARGET, "{}",
               RunStatus.QUEUED, at, at, at)  # fmt: skip


def _seed(store: Store, rows: Iterator[tuple[Any, ...]]) -> None:
    d = store.dialect
    conn = d.connect()
    try:
        d.begin_write(conn)
        d.execute(conn, "DELETE FROM events")
        d.execute(conn, "DELETE FROM runs")
        columns = ", ".join(_COLUMNS)
        if d.name == "postgres":
            with conn.cursor().copy(f"COPY runs ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join("?" for _ in _COLUMNS)
            conn.executemany(f"INSERT INTO runs ({columns}) VALUES ({marks})", rows)
        d.commit(conn)
        if d.name == "postgres":
            conn.autocommit = True  # VACUUM runs outside a transaction
            conn.execute("VACUUM ANALYZE runs")
            conn.autocommit = False
        else:
            conn.execute("ANALYZE")
    finally:
        d.close(conn)


def _requeue(tx: Tx, ids: list[str]) -> None:
    """Put claimed runs back as they were: queued, no lease, same available_at."""
    params: dict[str, Any] = {f"i{n}": run_id for n, run_id in enumerate(ids)}
    marks = ", ".join(f":i{n}" for n in range(len(ids)))
    tx.execute(
        "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
        f"write_token = NULL WHERE id IN ({marks})",
        params,
    )


@contextmanager
def _claim_statement(d: Dialect, full_rank: bool) -> Iterator[None]:
    """Let the store's claim path run the full-rank statement while inside."""
    if not full_rank:
        yield
        return
    d.claim_sql = lambda n_targets: full_rank_claim_sql(d, n_targets)  # type: ignore[method-assign]
    try:
        yield
    finally:
        del d.claim_sql  # the class's method again


async def _claim_ms(store: Store, limit: int, full_rank: bool) -> tuple[float, int]:
    with _claim_statement(store.dialect, full_rank):
        start = time.perf_counter()
        claimed = await store.claim_runs("bench-worker", [TARGET], limit, 600.0)
        took = (time.perf_counter() - start) * 1000
    ids = [r.id for r in claimed]
    if ids:
        await store.transact(_requeue, ids)
    return took, len(ids)


def _figures(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median_ms": round(statistics.median(ordered), 2), "p95_ms": round(p95, 2)}


async def measure(url: str, runs: int, claims: int, limit: int, tenants: int) -> dict[str, Any]:
    """Seed each shape at ``url`` and time interleaved claims of both conditions."""
    store = open_store(url)
    await store.open()
    out: dict[str, Any] = {"backend": store.dialect.name, "runs": runs, "limit": limit}
    try:
        for shape in SHAPES:
            rows = shape_rows(shape, runs, tenants, time.time())
            await asyncio.to_thread(_seed, store, rows)
            times: dict[str, list[float]] = {"claim": [], "full_rank": []}
            got: dict[str, int] = {}
            await _claim_ms(store, limit, False)  # warm the caches alike for both
            await _claim_ms(store, limit, True)
            for i in range(claims):
                order = (False, True) if i % 2 == 0 else (True, False)
                for full_rank in order:
                    took, n = await _claim_ms(store, limit, full_rank)
                    key = "full_rank" if full_rank else "claim"
                    times[key].append(took)
                    got[key] = n
            figures: dict[str, Any] = {k: _figures(v) for k, v in times.items()}
            figures["claimed"] = got
            figures["full_rank_over_claim"] = round(
                figures["full_rank"]["median_ms"] / figures["claim"]["median_ms"], 2
            )
            out[shape] = figures
    finally:
        await store.close()
    return out


def _print(result: dict[str, Any]) -> None:
    print(f"{result['backend']}: {result['runs']} due runs, claims of {result['limit']}")
    for shape in SHAPES:
        f = result[shape]
        print(
            f"  {shape:13} claim {f['claim']['median_ms']:8.2f} ms (p95 {f['claim']['p95_ms']:.2f})"
            f"   full rank {f['full_rank']['median_ms']:8.2f} ms "
            f"(p95 {f['full_rank']['p95_ms']:.2f})   ratio {f['full_rank_over_claim']}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentledger_bench.fair_claim")
    parser.add_argument("--db", help="an EMPTY database (default: a new SQLite file)")
    parser.add_argument("--runs", type=int, default=50_000)
    parser.add_argument("--claims", type=int, default=10)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--tenants", type=int, default=10_000, help="for many_tenants")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'fair.db'}"
        result = asyncio.run(measure(url, args.runs, args.claims, args.limit, args.tenants))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)


if __name__ == "__main__":
    main()
