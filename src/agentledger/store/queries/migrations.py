"""Schema migrations: numbered scripts per dialect, applied once each."""

from __future__ import annotations

import logging
import time
from typing import Any

from agentledger.backoff import Backoff
from agentledger.store.dialect import Dialect

log = logging.getLogger("agentledger.store")

#: How long opening a store waits, in all, for a lock another process holds on the
#: database before migrating (each wait is bounded by the busy timeout).
MIGRATION_WAIT = 120.0


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


def migrate(d: Dialect, conn: Any, *, wait: float | None = None) -> list[int]:
    """Apply every migration not yet applied; return the versions applied.

    Safe when several processes open one database at once (workers started together
    on a fresh file): the migrations run inside one write transaction that holds the
    database's exclusive lock (SQLite ``BEGIN IMMEDIATE``; PostgreSQL an advisory lock,
    see :meth:`PostgresDialect.begin_write`), and the applied versions are read again
    inside it, so the process that waited finds the schema made and applies nothing.
    A lock held elsewhere past the busy timeout (a slow first migration under load) is
    waited out for up to ``wait`` seconds (:data:`MIGRATION_WAIT`), never a failed start.
    """
    deadline = time.monotonic() + (MIGRATION_WAIT if wait is None else wait)
    backoff = Backoff(first=0.05, cap=1.0, jitter=False)
    while True:
        try:
            return _migrate_locked(d, conn)
        except Exception as exc:
            d.rollback(conn)
            if not d.is_locked(exc) or time.monotonic() >= deadline:
                raise
            log.warning("schema migration: the database is locked by another process (%s); "
                        "waiting", exc)  # fmt: skip
            time.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))


def _migrate_locked(d: Dialect, conn: Any) -> list[int]:
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
