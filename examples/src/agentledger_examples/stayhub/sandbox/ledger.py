"""The effect ledger: one append-only row per effect the sandbox actually applied.

Effect kinds: ``booking``, ``booking_cancel``, ``charge``, ``refund``, ``crm``, ``email``.
A replayed request never appends a row. Each row carries the run id the caller sent in its
``X-Run-Id`` header (if any), so checks can group effects by run without parsing keys.
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

EFFECT_KINDS: tuple[str, ...] = ("booking", "booking_cancel", "charge", "refund", "crm", "email")


def now_iso() -> str:
    """The current UTC time as an ISO 8601 string."""
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class Effect:
    """A ledger entry before it is appended (``seq`` and ``at`` are assigned on append)."""

    kind: str
    idempotency_key: str
    booking_id: str | None = None
    payment_id: str | None = None
    guest_id: str | None = None
    hotel_id: str | None = None
    check_in: str | None = None
    amount: int | None = None
    currency: str | None = None
    recipient: str | None = None
    subject: str | None = None
    expected_amount: int | None = None  # a charge: the booking's price when it was charged
    run_id: str | None = None  # the ``X-Run-Id`` header of the request that applied it


def append_effect(conn: sqlite3.Connection, effect: Effect, run_id: str | None = None) -> int:
    """Append ``effect`` (tagged with the request's ``run_id``) in the caller's transaction."""
    if effect.kind not in EFFECT_KINDS:
        raise ValueError(f"unknown effect kind {effect.kind!r}")
    row = {**asdict(effect), "at": now_iso()}
    if run_id is not None:
        row["run_id"] = run_id
    columns = ", ".join(row)
    marks = ", ".join(f":{name}" for name in row)
    cursor = conn.execute(f"INSERT INTO ledger ({columns}) VALUES ({marks})", row)
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def list_effects(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every ledger entry in ``seq`` order; ``None`` fields are left out."""
    rows = conn.execute("SELECT * FROM ledger ORDER BY seq").fetchall()
    return [{k: v for k, v in dict(row).items() if v is not None} for row in rows]
