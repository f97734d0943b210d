"""(e) Bytes stored per step, on SQLite (dbstat) and PostgreSQL (row sizes)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from agentledger.store import Store, open_store
from agentledger_bench.engine_runs import execute


def _sqlite_size(path: str) -> tuple[int, int, dict[str, int]]:
    """(page_count * page_size, used bytes by dbstat or -1, used bytes by b-tree) after
    a WAL checkpoint."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        try:
            used = conn.execute("SELECT SUM(pgsize - unused) FROM dbstat").fetchone()[0]
            by_btree = conn.execute(
                "SELECT name, SUM(pgsize - unused) FROM dbstat GROUP BY name"
            ).fetchall()
        except sqlite3.Error:
            used, by_btree = -1, []
        return int(pages * page_size), int(used or 0), {n: int(b or 0) for n, b in by_btree}
    finally:
        conn.close()


def _grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What grew, by name (where a step's bytes go)."""
    out = {name: size - before.get(name, 0) for name, size in after.items()}
    return {name: grown for name, grown in sorted(out.items()) if grown}


async def sqlite_bytes(workdir: Path, n: int, payload: int) -> dict[str, Any]:
    """Growth of a fresh database file from an empty run to an ``n``-step run."""
    path = workdir / f"bytes-{n}.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        await execute(store, "bench_payload", [{"steps": 0, "size": payload}], concurrency=1)
        base_file, base_used, base_by = _sqlite_size(str(path))
        await execute(store, "bench_payload", [{"steps": n, "size": payload}], concurrency=1)
        file, used, by_btree = _sqlite_size(str(path))
    finally:
        await store.close()
    return {
        "steps": n,
        "file_growth": file - base_file,
        "dbstat_used_growth": used - base_used if used >= 0 else -1,
        "growth_by_btree": _grown(base_by, by_btree),
    }


def _pg_run_bytes(url: str, run_id: str) -> dict[str, int]:
    """Row bytes of a run, by table."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        out = {}
        for table in ("runs", "steps", "events"):
            column = "id" if table == "runs" else "run_id"
            row = conn.execute(
                f"SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM {table} t WHERE {column} = %s",
                (run_id,),
            ).fetchone()
            out[table] = int(row[0]) if row else 0
        return out


async def postgres_bytes(store: Store, url: str, n: int, payload: int) -> dict[str, Any]:
    """Row bytes (``pg_column_size``) of an ``n``-step run minus those of an empty run."""
    ids = []
    for steps in (0, n):
        before = {r.id for r in await store.list_runs(name="bench_payload", limit=10**6)}
        await execute(store, "bench_payload", [{"steps": steps, "size": payload}], concurrency=1)
        after = {r.id for r in await store.list_runs(name="bench_payload", limit=10**6)}
        ids.append((after - before).pop())
    base = await asyncio.to_thread(_pg_run_bytes, url, ids[0])
    size = await asyncio.to_thread(_pg_run_bytes, url, ids[1])
    return {
        "steps": n,
        "row_growth": sum(size.values()) - sum(base.values()),
        "growth_by_table": _grown(base, size),
    }
