"""A tiny external provider ledger on its own SQLite file (path in ``ENGINE_LEDGER``).

It lives outside the worker process: every CALL is a row in ``calls`` and every
EFFECT a row in ``effects``. ``dedupe=True`` behaves like a provider that honours
idempotency keys (a second call with the same key applies nothing and returns the
first result); ``dedupe=False`` is a provider without keys (every call is an effect).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, key TEXT, kind TEXT, at REAL);
CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, key TEXT, kind TEXT, at REAL,
                                    result TEXT);
CREATE TABLE IF NOT EXISTS checks (id INTEGER PRIMARY KEY, key TEXT, at REAL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL);
"""


def path() -> str:
    return os.environ["ENGINE_LEDGER"]


def _connect(db: str | None = None) -> sqlite3.Connection:
    conn = sqlite3.connect(db or path(), timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(_SCHEMA)
    return conn


def _tx(db: str | None = None) -> sqlite3.Connection:
    conn = _connect(db)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def record_call(key: str, kind: str) -> None:
    """A call that applies nothing (the provider answered with an error)."""
    conn = _tx()
    try:
        conn.execute("INSERT INTO calls (key, kind, at) VALUES (?, ?, ?)", (key, kind, time.time()))
        conn.execute("COMMIT")
    finally:
        conn.close()


def apply(key: str, kind: str, dedupe: bool, payload: Any = None) -> dict[str, Any]:
    """Record a call and apply its effect (once per key when ``dedupe``)."""
    conn = _tx()
    try:
        now = time.time()
        conn.execute("INSERT INTO calls (key, kind, at) VALUES (?, ?, ?)", (key, kind, now))
        if dedupe:
            row = conn.execute(
                "SELECT result FROM effects WHERE key = ? ORDER BY id LIMIT 1", (key,)
            ).fetchone()
            if row is not None:
                conn.execute("COMMIT")
                return dict(json.loads(row[0]))
        cur = conn.execute(
            "INSERT INTO effects (key, kind, at, result) VALUES (?, ?, ?, '{}')", (key, kind, now)
        )
        result = {"key": key, "effect_id": cur.lastrowid, "kind": kind, "payload": payload}
        conn.execute(
            "UPDATE effects SET result = ? WHERE id = ?", (json.dumps(result), cur.lastrowid)
        )
        conn.execute("COMMIT")
        return result
    finally:
        conn.close()


def status(key: str) -> dict[str, Any] | None:
    """The first result for ``key``, or None when no effect happened (a status check)."""
    conn = _connect()
    try:
        conn.execute("INSERT INTO checks (key, at) VALUES (?, ?)", (key, time.time()))
        row = conn.execute(
            "SELECT result FROM effects WHERE key = ? ORDER BY id LIMIT 1", (key,)
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))
    finally:
        conn.close()


def bump(name: str) -> int:
    """Increment a counter kept across processes; return its new value."""
    conn = _tx()
    try:
        conn.execute(
            "INSERT INTO counters (name, n) VALUES (?, 1) "
            "ON CONFLICT(name) DO UPDATE SET n = n + 1",
            (name,),
        )
        (n,) = conn.execute("SELECT n FROM counters WHERE name = ?", (name,)).fetchone()
        conn.execute("COMMIT")
        return int(n)
    finally:
        conn.close()


# reading (tests) -----------------------------------------------------------


def _rows(db: str | None, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = _connect(db)
    try:
        return list(conn.execute(sql, params).fetchall())
    finally:
        conn.close()


def calls(
    db: str | None = None,
    *,
    key: str | None = None,
    kind: str | None = None,
    key_like: str | None = None,
) -> list[tuple[str, str, float]]:
    """(key, kind, at) of every call, oldest first, optionally filtered."""
    sql, params = "SELECT key, kind, at FROM calls WHERE 1=1", []
    for column, value, op in (("key", key, "="), ("kind", kind, "="), ("key", key_like, "LIKE")):
        if value is not None:
            sql += f" AND {column} {op} ?"
            params.append(value)
    rows = _rows(db, sql + " ORDER BY id", tuple(params))
    return [(str(k), str(t), float(a)) for k, t, a in rows]


def effects(db: str | None = None, *, kind: str | None = None) -> list[dict[str, Any]]:
    sql, params = "SELECT result FROM effects", ()
    if kind is not None:
        sql, params = sql + " WHERE kind = ?", (kind,)
    return [dict(json.loads(r[0])) for r in _rows(db, sql + " ORDER BY id", params)]


def count_calls(db: str | None = None, **filters: Any) -> int:
    return len(calls(db, **filters))


def count_effects(key: str, db: str | None = None) -> int:
    return len(_rows(db, "SELECT id FROM effects WHERE key = ?", (key,)))


def effect_counts(db: str | None = None, kind: str | None = None) -> dict[str, int]:
    """key -> number of effects."""
    out: dict[str, int] = {}
    for e in effects(db, kind=kind):
        out[e["key"]] = out.get(e["key"], 0) + 1
    return out


def call_counts(db: str | None = None, kind: str | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, _, _ in calls(db, kind=kind):
        out[k] = out.get(k, 0) + 1
    return out
