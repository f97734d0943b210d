"""Schema migrations: numbered scripts per dialect, applied once each."""

from __future__ import annotations

import time
from typing import Any

from agentledger.store.dialect import Dialect


def is_current(d: Dialect, conn: Any) -> bool:
    """True when every migration is applied, found without taking the write lock.

    Opening a store then costs a read, so a busy database (or a read-only command)
    is not held up by a write lock it does not need.
    """
    try:
        done = {r["version"] for r in d.fetchall(conn, "SELECT version FROM schema_migrations")}
    except Exception:  # no table yet (or no answer): the locked path decides
        d.rollback(conn)
        return False
    d.commit(conn)
    return all(version in done for version, _ in d.migrations())


def migrate(d: Dialect, conn: Any) -> list[int]:
    """Apply every migration not yet applied; return the versions applied."""
    if is_current(d, conn):
        return []
    d.begin_write(conn)
    d.execute(
        conn,
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
        "applied_at DOUBLE PRECISION NOT NULL)",
    )
    done = {r["version"] for r in d.fetchall(conn, "SELECT version FROM schema_migrations")}
    applied = []
    for version, script in d.migrations():
        if version in done:
            continue
        for statement in d.split_script(script):
            d.execute(conn, statement)
        d.execute(
            conn,
            "INSERT INTO schema_migrations (version, applied_at) VALUES (:v, :t)",
            {"v": version, "t": time.time()},
        )
        applied.append(version)
    d.commit(conn)
    return applied
