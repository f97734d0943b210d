"""Stripe-like idempotency records, one per (endpoint, key).

A write first *begins* its key (inserting an ``in_progress`` record, or finding the
existing one), then *completes* it in the same transaction that applies the effect. The
stored response (status code and exact body text) is what every later request with the
same key and the same parameters gets back.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from enum import Enum
from typing import Any

from agentledger.sandbox.ledger import now_iso


def request_hash(params: Any) -> str:
    """SHA-256 of the canonical JSON of a request's parameters."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class Verdict(Enum):
    """What :func:`begin` decided about a request."""

    NEW = "new"  # first use of the key: proceed, the record is now in progress
    REPLAY = "replay"  # same key, same parameters, completed: return the stored response
    IN_PROGRESS = "in_progress"  # same key, the first request has not finished
    MISMATCH = "mismatch"  # same key, different parameters


@dataclass(frozen=True)
class Record:
    """A stored idempotency record."""

    endpoint: str
    key: str
    request_hash: str
    state: str  # in_progress | done
    status_code: int | None
    response: str | None


def lookup(conn: sqlite3.Connection, endpoint: str, key: str) -> Record | None:
    """The record for (endpoint, key), or ``None``."""
    row = conn.execute(
        "SELECT endpoint, key, request_hash, state, status_code, response"
        " FROM idempotency WHERE endpoint = ? AND key = ?",
        (endpoint, key),
    ).fetchone()
    return None if row is None else Record(*row)


def begin(
    conn: sqlite3.Connection, endpoint: str, key: str, req_hash: str
) -> tuple[Verdict, Record | None]:
    """Claim ``key`` for a new request, or say why not (inside the caller's transaction)."""
    record = lookup(conn, endpoint, key)
    if record is None:
        conn.execute(
            "INSERT INTO idempotency (endpoint, key, request_hash, state, created_at)"
            " VALUES (?, ?, ?, 'in_progress', ?)",
            (endpoint, key, req_hash, now_iso()),
        )
        return Verdict.NEW, None
    if record.request_hash != req_hash:
        return Verdict.MISMATCH, record
    if record.state == "in_progress":
        return Verdict.IN_PROGRESS, record
    return Verdict.REPLAY, record


def complete(
    conn: sqlite3.Connection, endpoint: str, key: str, status_code: int, response: str
) -> None:
    """Store the final response of an in-progress key (inside the caller's transaction)."""
    conn.execute(
        "UPDATE idempotency SET state = 'done', status_code = ?, response = ?, completed_at = ?"
        " WHERE endpoint = ? AND key = ? AND state = 'in_progress'",
        (status_code, response, now_iso(), endpoint, key),
    )


def abandon(conn: sqlite3.Connection, endpoint: str, key: str) -> None:
    """Forget an in-progress key whose request failed before applying anything."""
    conn.execute(
        "DELETE FROM idempotency WHERE endpoint = ? AND key = ? AND state = 'in_progress'",
        (endpoint, key),
    )


def abandon_all_in_progress(conn: sqlite3.Connection) -> int:
    """Forget every in-progress key: on start-up, no request of a dead process is in flight.

    Nothing was applied for these keys (the effect and the completion commit together), so
    a status check says ``not_found`` and a retry with the same key applies the effect once.
    """
    return conn.execute("DELETE FROM idempotency WHERE state = 'in_progress'").rowcount


def status_view(record: Record | None) -> tuple[int, dict[str, Any]]:
    """The status-check answer for a record: ``succeeded`` / ``failed`` / ``pending`` / 404."""
    if record is None:
        return 404, {"status": "not_found"}
    if record.state == "in_progress" or record.status_code is None:
        return 200, {"status": "pending"}
    status = "succeeded" if record.status_code < 400 else "failed"
    body = json.loads(record.response) if record.response else None
    return 200, {"status": status, "status_code": record.status_code, "response": body}
