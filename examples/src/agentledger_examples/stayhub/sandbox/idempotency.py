"""Stripe-like idempotency records, one per (provider, key).

A write first *begins* its key (inserting an ``in_progress`` record, or finding the
existing one), then *completes* it in the same transaction that applies the effect. The
stored response (status code and exact body text) is what every later request with the
same key and the same parameters gets back, unless a 5xx was saved for the key
(``error_after_commit,save=1``): then that 5xx is replayed, while a status check by key
still reports the real outcome.

Keys are scoped per provider and pinned to the endpoint that first used them: the same key
on another endpoint of the same provider is an ``idempotency_error``, as Stripe answers for
one account. Bookings and payments are one provider account (StayHub's platform: a booking
key reused on a payment, or a charge key on a refund, is an error); the CRM and the mail
service are separate providers with their own key spaces. Keys are at most :data:`MAX_KEY_LENGTH`
characters and are pruned ``ttl`` seconds after first use (24 h by default): a request
after that is new.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

MAX_KEY_LENGTH = 255
DEFAULT_KEY_TTL = 24 * 3600.0

PROVIDERS: dict[str, str] = {
    "bookings.create": "stayhub",
    "bookings.cancel": "stayhub",
    "payments.create": "stayhub",
    "payments.refund": "stayhub",
    "crm": "crm",
    "crm.update": "crm",
    "email": "email",
}
"""The provider each write endpoint belongs to: the scope of its idempotency keys."""


def provider_of(endpoint: str) -> str:
    """The provider whose key space ``endpoint`` uses."""
    return PROVIDERS.get(endpoint, endpoint)


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
    WRONG_ENDPOINT = "wrong_endpoint"  # same key, first used on another endpoint


@dataclass(frozen=True)
class Record:
    """A stored idempotency record."""

    provider: str
    key: str
    endpoint: str
    request_hash: str
    state: str  # in_progress | done
    status_code: int | None
    response: str | None
    replay_status: int | None
    replay_response: str | None
    created_ts: float
    completed_ts: float | None

    def replayed(self) -> tuple[int, str]:
        """What a retry with this key gets: the saved 5xx if any, else the real answer."""
        if self.replay_status is not None:
            return self.replay_status, self.replay_response or "{}"
        assert self.status_code is not None
        return self.status_code, self.response or "{}"


_COLUMNS = (
    "provider, key, endpoint, request_hash, state, status_code, response,"
    " replay_status, replay_response, created_ts, completed_ts"
)


def prune(conn: sqlite3.Connection, ttl: float, now: float | None = None) -> int:
    """Forget completed keys first used more than ``ttl`` seconds ago."""
    cutoff = (time.time() if now is None else now) - ttl
    return conn.execute(
        "DELETE FROM idempotency WHERE state = 'done' AND created_ts < ?", (cutoff,)
    ).rowcount


def lookup(conn: sqlite3.Connection, endpoint: str, key: str) -> Record | None:
    """The record of ``key`` in the endpoint's provider scope (any endpoint), or ``None``."""
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM idempotency WHERE provider = ? AND key = ?",
        (provider_of(endpoint), key),
    ).fetchone()
    return None if row is None else Record(*row)


def begin(
    conn: sqlite3.Connection, endpoint: str, key: str, req_hash: str, ttl: float = DEFAULT_KEY_TTL
) -> tuple[Verdict, Record | None]:
    """Claim ``key`` for a new request, or say why not (inside the caller's transaction)."""
    prune(conn, ttl)
    record = lookup(conn, endpoint, key)
    if record is None:
        conn.execute(
            "INSERT INTO idempotency (provider, key, endpoint, request_hash, state, created_ts)"
            " VALUES (?, ?, ?, ?, 'in_progress', ?)",
            (provider_of(endpoint), key, endpoint, req_hash, time.time()),
        )
        return Verdict.NEW, None
    if record.endpoint != endpoint:
        return Verdict.WRONG_ENDPOINT, record
    if record.request_hash != req_hash:
        return Verdict.MISMATCH, record
    if record.state == "in_progress":
        return Verdict.IN_PROGRESS, record
    return Verdict.REPLAY, record


def complete(
    conn: sqlite3.Connection,
    endpoint: str,
    key: str,
    status_code: int,
    response: str,
    replay: tuple[int, str] | None = None,
) -> None:
    """Store the final response of an in-progress key (inside the caller's transaction).

    ``replay`` is a saved error answer that retries get instead of ``response``.
    """
    replay_status, replay_response = replay if replay is not None else (None, None)
    conn.execute(
        "UPDATE idempotency SET state = 'done', status_code = ?, response = ?,"
        " replay_status = ?, replay_response = ?, completed_ts = ?"
        " WHERE provider = ? AND key = ? AND state = 'in_progress'",
        (
            status_code,
            response,
            replay_status,
            replay_response,
            time.time(),
            provider_of(endpoint),
            key,
        ),
    )


def abandon(conn: sqlite3.Connection, endpoint: str, key: str) -> None:
    """Forget an in-progress key whose request failed before applying anything."""
    conn.execute(
        "DELETE FROM idempotency WHERE provider = ? AND key = ? AND state = 'in_progress'",
        (provider_of(endpoint), key),
    )


def abandon_all_in_progress(conn: sqlite3.Connection) -> int:
    """Forget every in-progress key: on start-up, no request of a dead process is in flight.

    Nothing was applied for these keys (the effect and the completion commit together), so
    a status check says ``not_found`` and a retry with the same key applies the effect once.
    """
    return conn.execute("DELETE FROM idempotency WHERE state = 'in_progress'").rowcount


def status_view(
    record: Record | None, endpoint: str, lag: float = 0.0, now: float | None = None
) -> tuple[int, dict[str, Any]]:
    """The status-check answer for a record: ``succeeded`` / ``failed`` / ``pending`` / 404.

    A record of another endpoint is not this endpoint's (404). ``lag`` seconds after the
    commit the record is not visible yet (404), as a lagging search index.
    """
    if record is None or record.endpoint != endpoint:
        return 404, {"status": "not_found"}
    if record.state == "in_progress" or record.status_code is None:
        return 200, {"status": "pending"}
    now = time.time() if now is None else now
    if lag and record.completed_ts is not None and now - record.completed_ts < lag:
        return 404, {"status": "not_found"}
    status = "succeeded" if record.status_code < 400 else "failed"
    body = json.loads(record.response) if record.response else None
    return 200, {"status": status, "status_code": record.status_code, "response": body}
