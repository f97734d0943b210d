"""The effect ledger: one append-only row per effect the sandbox actually applied.

Effect kinds: ``booking``, ``booking_cancel``, ``charge``, ``refund``, ``crm``, ``email``.
A replayed request never appends a row.
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


def append_effect(conn: sqlite3.Connection, effect: Effect) -> int:
    """Append ``effect`` inside the caller's transaction; return its ``seq``."""
    if effect.kind not in EFFECT_KINDS:
        raise ValueError(f"unknown effect kind {effect.kind!r}")
    row = {**asdict(effect), "at": now_iso()}
    columns = ", ".join(row)
    marks = ", ".join(f":{name}" for name in row)
    cursor = conn.execute(f"INSERT INTO ledger ({columns}) VALUES ({marks})", row)
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def list_effects(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every ledger entry in ``seq`` order; ``None`` fields are left out."""
    rows = conn.execute("SELECT * FROM ledger ORDER BY seq").fetchall()
    return [{k: v for k, v in dict(row).items() if v is not None} for row in rows]
