"""(a) The physical limit: a raw INSERT+COMMIT on the same disk or server."""

from __future__ import annotations

import sqlite3
import time
import uuid


def raw_sqlite_commit_us(path: str, n: int) -> float:
    """µs per INSERT+COMMIT, WAL, synchronous=FULL, BEGIN IMMEDIATE like the store."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_steps (run_id TEXT NOT NULL, "
            "step_no INTEGER NOT NULL, output TEXT, PRIMARY KEY (run_id, step_no))"
        )
        run_id = uuid.uuid4().hex
        start = time.perf_counter()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO raw_steps VALUES (?, ?, ?)", (run_id, i, str(i)))
            conn.execute("COMMIT")
        return (time.perf_counter() - start) / n * 1e6
    finally:
        conn.close()


_PG_RAW_TABLE = "agentledger_bench_raw"


def raw_postgres_commit_us(url: str, n: int) -> float:
    """µs per INSERT+COMMIT with psycopg on the server (a logged table)."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_PG_RAW_TABLE} (run_id TEXT NOT NULL, "
            "step_no INTEGER NOT NULL, output TEXT, PRIMARY KEY (run_id, step_no))"
        )
        conn.commit()
        run_id = uuid.uuid4().hex
        start = time.perf_counter()
        for i in range(n):
            conn.execute(f"INSERT INTO {_PG_RAW_TABLE} VALUES (%s, %s, %s)", (run_id, i, str(i)))
            conn.commit()
        return (time.perf_counter() - start) / n * 1e6


def drop_postgres_raw(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {_PG_RAW_TABLE}")


def postgres_settings(url: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        out = {}
        for name in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "commit_delay",
        ):
            row = conn.execute(f"SHOW {name}").fetchone()
            out[name] = str(row[0]) if row else "?"
        return out
