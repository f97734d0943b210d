"""The sandbox's SQLite file: schema, one guarded connection, atomic transactions.

One sandbox process owns a ledger file at a time. Every write path runs inside
:meth:`Database.transaction` (``BEGIN IMMEDIATE`` under a lock), so applying an effect,
appending its ledger entry and storing the idempotency record commit together or not at all.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    provider        TEXT NOT NULL,
    key             TEXT NOT NULL,
    endpoint        TEXT NOT NULL,
    request_hash    TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('in_progress', 'done')),
    status_code     INTEGER,
    response        TEXT,
    replay_status   INTEGER,
    replay_response TEXT,
    created_ts      REAL NOT NULL,
    completed_ts    REAL,
    PRIMARY KEY (provider, key)
);
CREATE TABLE IF NOT EXISTS ledger (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    booking_id      TEXT,
    payment_id      TEXT,
    guest_id        TEXT,
    hotel_id        TEXT,
    check_in        TEXT,
    amount          INTEGER,
    currency        TEXT,
    recipient       TEXT,
    subject         TEXT,
    expected_amount INTEGER,
    run_id          TEXT,
    at              TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS bookings (
    booking_id      TEXT PRIMARY KEY,
    hotel_id        TEXT NOT NULL,
    guest_id        TEXT NOT NULL,
    check_in        TEXT NOT NULL,
    nights          INTEGER NOT NULL,
    amount          INTEGER NOT NULL,
    currency        TEXT NOT NULL,
    status          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    created_at      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS payments (
    payment_id      TEXT PRIMARY KEY,
    booking_id      TEXT NOT NULL,
    guest_id        TEXT NOT NULL,
    amount          INTEGER NOT NULL,
    currency        TEXT NOT NULL,
    status          TEXT NOT NULL,
    refund_id       TEXT,
    idempotency_key TEXT NOT NULL,
    created_at      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS inventory (
    hotel_id TEXT NOT NULL,
    night    TEXT NOT NULL,
    booked   INTEGER NOT NULL,
    PRIMARY KEY (hotel_id, night)
);
CREATE TABLE IF NOT EXISTS contacts (
    guest_id   TEXT PRIMARY KEY,
    contact_id TEXT NOT NULL,
    booking_id TEXT,
    fields     TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS emails (
    email_id   TEXT PRIMARY KEY,
    recipient  TEXT NOT NULL,
    subject    TEXT NOT NULL,
    body       TEXT NOT NULL,
    booking_id TEXT,
    sent_at    TEXT NOT NULL
);
"""

TABLES = ("idempotency", "ledger", "bookings", "payments", "inventory", "contacts", "emails")


def default_ledger_path() -> str:
    """A fresh ledger file in a new temporary directory."""
    return str(Path(tempfile.mkdtemp(prefix="stayhub-sandbox-")) / "ledger.db")


class Database:
    """One SQLite connection (WAL) guarded by a lock; see :meth:`transaction`."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or default_ledger_path()
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        with self.transaction() as conn:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Run the block in one ``BEGIN IMMEDIATE`` transaction; roll back on error."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def reset(self) -> None:
        """Delete every row of every table (ledger, idempotency, bookings, inventory...)."""
        with self.transaction() as conn:
            for table in TABLES:
                conn.execute(f"DELETE FROM {table}")  # fixed table names

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()
