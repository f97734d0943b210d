"""Schema migrations: numbered scripts per dialect, applied once each."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from agentledger._backoff import Backoff
from agentledger.errors import UsageError
from agentledger.store._tx import Tx

log = logging.getLogger("agentledger.store")

#: How long opening a store waits, in all, for a lock another process holds on the
#: database before migrating (each wait is bounded by the busy timeout).
MIGRATION_WAIT = 120.0

#: A worker that heartbeat within this many seconds is live: an offline migration is
#: not applied while one is (the same window as ``agentledger workers``).
LIVE_WITHIN = 60.0

# A migration that the previous release's workers cannot run beside declares it in a
# comment line of its own: ``-- offline: <why>``.
_OFFLINE = re.compile(r"^\s*--\s*offline:\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)


@dataclass(frozen=True)
class Migration:
    """One migration as ``agentledger migrate --status`` shows it."""

    version: int
    #: The file's name without its number (empty for one this release does not know).
    name: str
    #: When it was applied (epoch seconds); None while pending.
    applied_at: float | None
    #: Why it cannot run while the previous release's workers serve; None: online.
    offline: str | None = None
    #: False for a migration applied by a newer release than this code.
    known: bool = True


class OfflineMigrationRefused(UsageError):
    """A pending migration is offline and live workers still serve the database."""


def offline_reason(script: str) -> str | None:
    """Why a migration script cannot run with the previous release's workers serving
    (its ``-- offline: why`` line), or None when it can (an expand migration)."""
    found = _OFFLINE.search(script)
    return found.group(1) if found else None


def _applied(tx: Tx) -> dict[int, float]:
    """Applied versions and when; {} when the database has no schema yet."""
    try:
        found = tx.fetchall("SELECT version, applied_at FROM schema_migrations")
    except Exception:  # no table yet: nothing applied
        tx.dialect.rollback(tx.conn)
        return {}
    tx.dialect.commit(tx.conn)
    return {int(r["version"]): float(r["applied_at"]) for r in found}


def migration_status(tx: Tx) -> list[Migration]:
    """Every migration this code knows, applied or pending, and those a newer release
    applied, in order; reads only."""
    applied = _applied(tx)
    known = {version: (name, script) for version, name, script in tx.dialect.migration_files()}
    for version, script in tx.dialect.migrations():  # a dialect may be given its scripts
        known.setdefault(version, ("", script))
    found = [
        Migration(version, name, applied.get(version), offline_reason(script))
        for version, (name, script) in known.items()
    ]
    found += [
        Migration(version, "", at, known=False)
        for version, at in applied.items()
        if version not in known
    ]
    return sorted(found, key=lambda m: m.version)


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
    todo = [(v, script) for v, script in tx.dialect.migrations() if v not in done]
    offline = [v for v, script in todo if offline_reason(script)]
    if offline and done:  # a fresh database has no workers to wait for
        _refuse_offline_while_served(tx, offline)
    applied = []
    for version, script in todo:
        for statement in tx.dialect.split_script(script):
            tx.execute(statement)
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (:v, :t)",
            {"v": version, "t": time.time()},
        )
        applied.append(version)
    tx.dialect.commit(tx.conn)
    return applied


def _refuse_offline_while_served(tx: Tx, offline: list[int]) -> None:
    """Raise when live workers serve the database: an offline migration changes what
    the previous release's workers read or write, so they must stop first."""
    live = tx.fetchall(
        f"SELECT count(*) AS n FROM workers WHERE heartbeat_at > {tx.now} - :within",
        {"within": LIVE_WITHIN},
    )
    count = int(live[0]["n"]) if live else 0
    if count:
        names = ", ".join(f"{v:04d}" for v in offline)
        raise OfflineMigrationRefused(
            f"migration {names} is offline and {count} live worker(s) serve this database: "
            "stop them first (SIGTERM; a worker killed without it counts as live for "
            f"{LIVE_WITHIN:.0f} s), then run `agentledger migrate`"
        )
