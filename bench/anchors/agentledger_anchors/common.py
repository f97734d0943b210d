"""What every system's measurement shares: the raw commit, sizes, payloads, clocks."""

from __future__ import annotations

import importlib
import os
import sqlite3
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

# Where agentledger's bench lives; looked up at run time so that moving it into a
# package of its own (or renaming it) only needs a name added here, or the
# AGENTLEDGER_BENCH_MODULE environment variable.
_BENCH_PACKAGES = ("agentledger.bench", "agentledger_bench")


def bench_module(leaf: str = "", needs: tuple[str, ...] = ()) -> ModuleType:
    """agentledger's bench package (``leaf=""``) or one of its modules, found by name."""
    extra = os.environ.get("AGENTLEDGER_BENCH_MODULE")
    packages = ((extra,) if extra else ()) + _BENCH_PACKAGES
    tried = []
    for package in packages:
        name = f"{package}.{leaf}" if leaf else package
        tried.append(name)
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if all(hasattr(module, attr) for attr in needs):
            return module
    raise RuntimeError(f"agentledger's bench not found (tried {', '.join(tried)})")


def raw_commit_us(store: str, target: str, n: int) -> float:
    """µs per raw INSERT+COMMIT on the store: agentledger's own baseline (a)."""
    baseline = bench_module("baseline", ("raw_sqlite_commit_us", "raw_postgres_commit_us"))
    if store == "sqlite":
        return float(baseline.raw_sqlite_commit_us(target, n))
    return float(baseline.raw_postgres_commit_us(target, n))


def drop_raw(store: str, target: str) -> None:
    if store == "postgresql":
        bench_module("baseline", ("drop_postgres_raw",)).drop_postgres_raw(target)


def message(i: int, size: int) -> str:
    """A ``size``-character payload, distinct per step (as agentledger's bench writes)."""
    seed = f"{i:08d}-"
    return (seed * (size // len(seed) + 1))[:size]


class Clock:
    """First-step start and last-step end, in the step loop of a workflow."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.w0 = time.time()

    def done(self, steps: int) -> dict[str, Any]:
        return {
            "steps": steps,
            "elapsed_s": time.perf_counter() - self.t0,
            "t_first": self.w0,
            "t_last": time.time(),
        }


def span_rate(results: list[dict[str, Any]]) -> float:
    """All steps / (last step end - first step start), across concurrent runs."""
    total = sum(int(r["steps"]) for r in results)
    span = max(r["t_last"] for r in results) - min(r["t_first"] for r in results)
    return total / span


def sqlite_used_bytes(path: str) -> int:
    """``SUM(pgsize - unused)`` over every b-tree page after a WAL checkpoint (dbstat)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return int(conn.execute("SELECT SUM(pgsize - unused) FROM dbstat").fetchone()[0] or 0)
    finally:
        conn.close()


def pg_rows_bytes(url: str, schema: str, column: str, value: str) -> int:
    """``SUM(pg_column_size(row))`` over every table of ``schema`` keyed by ``column``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.columns "
                "WHERE table_schema = %s AND column_name = %s",
                (schema, column),
            ).fetchall()
        ]
        total = 0
        for table in tables:
            row = conn.execute(
                f'SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM "{schema}"."{table}" t '
                f'WHERE "{column}" = %s',
                (value,),
            ).fetchone()
            total += int(row[0]) if row else 0
        return total


def interleave(
    reps: int, raw: Callable[[], float], cases: dict[str, Callable[[], float]]
) -> dict[str, list[float]]:
    """raw, case1, case2, ..., raw, case1, ... ``reps`` times: samples per name."""
    samples: dict[str, list[float]] = {"raw": [], **{name: [] for name in cases}}
    for _ in range(reps):
        samples["raw"].append(raw())
        for name, case in cases.items():
            samples[name].append(case())
    return samples
