"""Schema migrations: numbered scripts per dialect, applied once each."""

from __future__ import annotations

import logging
import time

from agentledger.backoff import Backoff
from agentledger.store.tx import Tx

log = logging.getLogger("agentledger.store")

#: How long opening a store waits, in all, for a lock another process holds on the
#: database before migrating (each wait is bounded by the busy timeout).
MIGRATION_WAIT = 120.0


def is_current(tx: Tx) -> bool:
    """True when every migration is applied, found without taking the write lock.

    Opening a store then costs a read, so a busy database (or a read-only command)
    is not held up by a write lock it does not need.
    """
    try:
        done = {r["version"] for r in tx.fetchall("SELECT version FROM schema_migrations")}
    except Exception:  # no table yet (or no answer): the locked path decides
        tx.dialect.rollback(tx.conn)
        return False
    tx.dialect.commit(tx.conn)
    return all(version in done for version, _ in tx.dialect.migrations())


def migrate(tx: Tx, *, wait: float | None = None) -> list[int]:
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
            return _migrate_locked(tx)
        except Exception as exc:
            tx.dialect.rollback(tx.conn)
            if not tx.dialect.is_locked(exc) or time.monotonic() >= deadline:
                raise
            log.warning("schema migration: the database is locked by another process (%s); "
                        "waiting", exc)  # fmt: skip
            time.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))


def _migrate_locked(tx: Tx) -> list[int]:
    if is_current(tx):
        return []
    tx.dialect.begin_write(tx.conn)
    tx.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
        "applied_at DOUBLE PRECISION NOT NULL)",
    )
    done = {r["version"] for r in tx.fetchall("SELECT version FROM schema_migrations")}
    applied = []
    for version, script in tx.dialect.migrations():
        if version in done:
            continue
        for statement in tx.dialect.split_script(script):
            tx.execute(statement)
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (:v, :t)",
            {"v": version, "t": time.time()},
        )
        applied.append(version)
    tx.dialect.commit(tx.conn)
    return applied
