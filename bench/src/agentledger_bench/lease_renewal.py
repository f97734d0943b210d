"""What one heartbeat's lease renewal costs: ``python -m agentledger_bench.lease_renewal
[--db URL] [--leases 1,50,500] [--others 2000] [--reps 50] [--json]``.

Seeds a store (a new SQLite file, or the EMPTY database ``--db`` names) with, for each
size in ``--leases``, that many runs claimed by one worker, and ``--others`` runs claimed
by other workers (a shared database: the renewal must find its own rows among theirs).
Each renewal goes through the store (``store.transact``, one write transaction, what a
worker's ``renew_leases`` costs), renewing every lease of the worker at its epoch.

Two conditions are timed, interleaved (one renewal of each per repetition, so the noise
of a shared machine hits both alike):

- ``one_statement``: the store's renewal (``renew_leases``: one UPDATE, rows locked in
  id order);
- ``per_row``: the renewal as it was before, one UPDATE per run in id order.

Figures, in microseconds, median and p95 per condition and the ratio of the medians
(one statement / per row), of two spans: ``statement``, the renewal's statements inside
the transaction; ``transaction``, the whole write transaction through the store (with
its commit: on SQLite an fsync, on PostgreSQL a round trip and the WAL flush).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentledger.store import NewRun, Store, open_store
from agentledger.store._queries.runs import renew_leases
from agentledger.store._tx import Tx

TARGET = "bench_lease@1"
_KEYS = (
    "one_statement_statement",
    "per_row_statement",
    "one_statement_transaction",
    "per_row_transaction",
)
LEASE = 600.0


def per_row_renewal(tx: Tx, owner: str, leases: dict[str, int], lease_seconds: float) -> set[str]:
    """The renewal before one statement: one fenced UPDATE per run, in id order."""
    lost = set()
    for run_id, epoch in sorted(leases.items()):
        changed = tx.execute(
            f"UPDATE runs SET lease_expires_at = {tx.now} + :lease WHERE id = :id "
            "AND lease_epoch = :epoch AND lease_owner = :owner AND status = 'running'",
            {"lease": float(lease_seconds), "id": run_id, "epoch": epoch, "owner": owner},
        )
        if changed == 0:
            lost.add(run_id)
    return lost


async def _claim(store: Store, owner: str, n: int) -> dict[str, int]:
    leases: dict[str, int] = {}
    for _ in range(n):
        await store.create_run(NewRun(kind="agent", name="bench_lease", version="1", input={}))
    while len(leases) < n:
        got = await store.claim_runs(owner, [TARGET], min(500, n - len(leases)), LEASE)
        leases.update({r.id: r.lease_epoch for r in got})
    return leases


async def _renew_us(
    store: Store, leases: dict[str, int], owner: str, per_row: bool
) -> tuple[float, float]:
    """One renewal: the microseconds of its statements (inside the transaction) and of
    the whole transaction through the store (its commit, the writer thread's hand-off)."""
    op = per_row_renewal if per_row else renew_leases
    inside: list[float] = []

    def timed(tx: Tx) -> set[str]:
        began = time.perf_counter()
        try:
            return op(tx, owner, leases, LEASE)
        finally:
            inside.append((time.perf_counter() - began) * 1e6)

    started = time.perf_counter()
    lost = await store.transact(timed)
    elapsed = (time.perf_counter() - started) * 1e6
    assert lost == set(), lost
    return inside[-1], elapsed


def _analyze(tx: Tx) -> None:
    tx.execute("ANALYZE runs")


def _figures(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return {"median_us": round(statistics.median(ordered), 1), "p95_us": round(p95, 1)}


async def measure(url: str, sizes: list[int], others: int, reps: int) -> dict[str, Any]:
    store = open_store(url)
    await store.open()
    try:
        for i in range(others // 100):
            await _claim(store, f"other-{i}", 100)
        result: dict[str, Any] = {"others": others, "reps": reps}
        for size in sizes:
            owner = f"w-{size}"
            leases = await _claim(store, owner, size)
            await store.transact(_analyze)  # planner statistics, as a live database has
            times: dict[str, list[float]] = {k: [] for k in _KEYS}
            for rep in range(reps + 3):
                order = (False, True) if rep % 2 else (True, False)
                for per_row in order:
                    statement, transaction = await _renew_us(store, leases, owner, per_row)
                    if rep >= 3:  # the first ones warm the caches and prepare the statements
                        name = "per_row" if per_row else "one_statement"
                        times[f"{name}_statement"].append(statement)
                        times[f"{name}_transaction"].append(transaction)
            row: dict[str, Any] = {k: _figures(v) for k, v in times.items()}
            for part in ("statement", "transaction"):
                one, per = row[f"one_statement_{part}"], row[f"per_row_{part}"]
                row[f"ratio_{part}"] = round(one["median_us"] / per["median_us"], 3)
            result[str(size)] = row
        return result
    finally:
        await store.close()


def _print(result: dict[str, Any]) -> None:
    print(f"others: {result['others']} running runs, {result['reps']} renewals per condition")
    print("median / p95 us: the statements inside the transaction; the whole transaction")
    head = f"{'leases':>7} {'one statement':>17} {'per row':>17} {'ratio':>6}"
    print(f"{head}  {'one statement':>17} {'per row':>17} {'ratio':>6}")
    for key, row in result.items():
        if key in ("others", "reps"):
            continue
        line = f"{key:>7}"
        for part in ("statement", "transaction"):
            for name in ("one_statement", "per_row"):
                f = row[f"{name}_{part}"]
                line += f" {f['median_us']:>8.0f} / {f['p95_us']:<6.0f}"
            line += f" {row[f'ratio_{part}']:>6.2f} "
        print(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentledger_bench.lease_renewal")
    parser.add_argument("--db", help="an EMPTY database (default: a new SQLite file)")
    parser.add_argument("--leases", default="1,50,500", help="sizes, comma-separated")
    parser.add_argument("--others", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.leases.split(",") if s.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'leases.db'}"
        result = asyncio.run(measure(url, sizes, args.others, args.reps))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)


if __name__ == "__main__":
    main()
