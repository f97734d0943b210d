"""StayHub's provider semantics: inventory, bookings, payments, refunds, CRM, email.

Every function runs inside the caller's transaction and returns an :class:`Outcome`: the
HTTP status, the JSON body and, when something was actually changed, the ledger
:class:`~agentledger_examples.stayhub.sandbox.ledger.Effect`. Business errors (sold out, card
declined, contact exists...) carry no effect.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from agentledger_examples.stayhub.sandbox import catalog
from agentledger_examples.stayhub.sandbox.catalog import money
from agentledger_examples.stayhub.sandbox.ledger import Effect, now_iso


@dataclass(frozen=True)
class Outcome:
    """The result of one provider operation."""

    status_code: int
    body: dict[str, Any]
    effect: Effect | None = None


def _error(status_code: int, error: str, **extra: Any) -> Outcome:
    return Outcome(status_code, {"error": error, **extra})


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _nights(check_in: date, nights: int) -> list[str]:
    return [(check_in + timedelta(days=n)).isoformat() for n in range(nights)]


def rooms_left(conn: sqlite3.Connection, hotel: catalog.Hotel, check_in: date, nights: int) -> int:
    """Rooms free on every night of the stay."""
    booked = 0
    for night in _nights(check_in, nights):
        row = conn.execute(
            "SELECT booked FROM inventory WHERE hotel_id = ? AND night = ?",
            (hotel.hotel_id, night),
        ).fetchone()
        booked = max(booked, row[0] if row else 0)
    return max(0, hotel.rooms - booked)


def _adjust_inventory(
    conn: sqlite3.Connection, hotel_id: str, check_in: date, nights: int, delta: int
) -> None:
    for night in _nights(check_in, nights):
        conn.execute(
            "INSERT INTO inventory (hotel_id, night, booked) VALUES (?, ?, MAX(0, ?))"
            " ON CONFLICT (hotel_id, night) DO UPDATE SET booked = MAX(0, booked + ?)",
            (hotel_id, night, delta, delta),
        )


def availability(conn: sqlite3.Connection, hotel_id: str, check_in: date, nights: int) -> Outcome:
    """Whether the hotel has a room for the stay, and its total price."""
    hotel = catalog.hotel(hotel_id)
    if hotel is None:
        return _error(404, "hotel_not_found")
    left = rooms_left(conn, hotel, check_in, nights)
    body = {
        "hotel_id": hotel_id,
        "check_in": check_in.isoformat(),
        "nights": nights,
        "available": left > 0,
        "rooms_left": left,
        "total": money(hotel.price_per_night * nights),
    }
    return Outcome(200, body)


def _booking_json(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "booking_id": row["booking_id"],
        "status": row["status"],
        "hotel_id": row["hotel_id"],
        "guest_id": row["guest_id"],
        "check_in": row["check_in"],
        "nights": row["nights"],
        "total": money(row["amount"], row["currency"]),
    }


def _booking_row(conn: sqlite3.Connection, booking_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM bookings WHERE booking_id = ?", (booking_id,)
    ).fetchone()
    return row


def get_booking(conn: sqlite3.Connection, booking_id: str) -> Outcome:
    """The booking, confirmed or cancelled."""
    row = _booking_row(conn, booking_id)
    return _error(404, "booking_not_found") if row is None else Outcome(200, _booking_json(row))


def create_booking(
    conn: sqlite3.Connection, key: str, hotel_id: str, guest_id: str, check_in: date, nights: int
) -> Outcome:
    """Hold a room for the stay at a server-computed total."""
    hotel = catalog.hotel(hotel_id)
    if hotel is None:
        return _error(404, "hotel_not_found")
    if catalog.guest(guest_id) is None:
        return _error(404, "guest_not_found")
    if rooms_left(conn, hotel, check_in, nights) <= 0:
        return _error(409, "sold_out")
    _adjust_inventory(conn, hotel_id, check_in, nights, +1)
    booking_id = _new_id("bk")
    amount = hotel.price_per_night * nights
    conn.execute(
        "INSERT INTO bookings VALUES (?, ?, ?, ?, ?, ?, ?, 'confirmed', ?, ?)",
        (
            booking_id,
            hotel_id,
            guest_id,
            check_in.isoformat(),
            nights,
            amount,
            catalog.CURRENCY,
            key,
            now_iso(),
        ),
    )
    row = _booking_row(conn, booking_id)
    assert row is not None
    effect = Effect(
        kind="booking",
        idempotency_key=key,
        booking_id=booking_id,
        guest_id=guest_id,
        hotel_id=hotel_id,
        check_in=check_in.isoformat(),
        amount=amount,
        currency=catalog.CURRENCY,
    )
    return Outcome(201, _booking_json(row), effect)


def cancel_booking(conn: sqlite3.Connection, key: str, booking_id: str) -> Outcome:
    """Cancel a confirmed booking and release its room."""
    row = _booking_row(conn, booking_id)
    if row is None:
        return _error(404, "booking_not_found")
    if row["status"] == "cancelled":
        return _error(409, "already_cancelled")
    conn.execute("UPDATE bookings SET status = 'cancelled' WHERE booking_id = ?", (booking_id,))
    check_in = date.fromisoformat(row["check_in"])
    _adjust_inventory(conn, row["hotel_id"], check_in, row["nights"], -1)
    effect = Effect(
        kind="booking_cancel",
        idempotency_key=key,
        booking_id=booking_id,
        guest_id=row["guest_id"],
        hotel_id=row["hotel_id"],
        check_in=row["check_in"],
    )
    return Outcome(200, {**_booking_json(row), "status": "cancelled"}, effect)


def _payment_json(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "payment_id": row["payment_id"],
        "status": row["status"],
        "booking_id": row["booking_id"],
        "guest_id": row["guest_id"],
        "amount": money(row["amount"], row["currency"]),
    }


def get_payment(conn: sqlite3.Connection, payment_id: str) -> Outcome:
    """The payment (``succeeded`` or ``refunded``)."""
    row = conn.execute("SELECT * FROM payments WHERE payment_id = ?", (payment_id,)).fetchone()
    return _error(404, "payment_not_found") if row is None else Outcome(200, _payment_json(row))


def create_payment(
    conn: sqlite3.Connection,
    key: str,
    booking_id: str,
    guest_id: str,
    amount: int,
    currency: str,
    declined: bool,
) -> Outcome:
    """Charge what is asked, as Stripe does: the payments provider knows nothing of bookings.

    The booking id is metadata; the booking's price at the time (if such a booking exists)
    is recorded beside the charged amount so the ledger checks can compare them. A decline
    is a 402.
    """
    if declined:
        return _error(402, "card_declined")
    booking = _booking_row(conn, booking_id)
    payment_id = _new_id("pay")
    conn.execute(
        "INSERT INTO payments VALUES (?, ?, ?, ?, ?, 'succeeded', NULL, ?, ?)",
        (payment_id, booking_id, guest_id, amount, currency, key, now_iso()),
    )
    row = conn.execute("SELECT * FROM payments WHERE payment_id = ?", (payment_id,)).fetchone()
    effect = Effect(
        kind="charge",
        idempotency_key=key,
        booking_id=booking_id,
        payment_id=payment_id,
        guest_id=guest_id,
        amount=amount,
        currency=currency,
        expected_amount=None if booking is None else booking["amount"],
    )
    return Outcome(201, _payment_json(row), effect)


def refund_payment(conn: sqlite3.Connection, key: str, payment_id: str) -> Outcome:
    """Refund a payment in full."""
    row = conn.execute("SELECT * FROM payments WHERE payment_id = ?", (payment_id,)).fetchone()
    if row is None:
        return _error(404, "payment_not_found")
    if row["status"] == "refunded":
        return _error(409, "already_refunded", refund_id=row["refund_id"])
    refund_id = _new_id("re")
    conn.execute(
        "UPDATE payments SET status = 'refunded', refund_id = ? WHERE payment_id = ?",
        (refund_id, payment_id),
    )
    effect = Effect(
        kind="refund",
        idempotency_key=key,
        booking_id=row["booking_id"],
        payment_id=payment_id,
        guest_id=row["guest_id"],
        amount=row["amount"],
        currency=row["currency"],
    )
    body = {
        "refund_id": refund_id,
        "status": "succeeded",
        "payment_id": payment_id,
        "booking_id": row["booking_id"],
        "amount": money(row["amount"], row["currency"]),
    }
    return Outcome(201, body, effect)


def _contact_json(row: sqlite3.Row | None, **values: Any) -> dict[str, Any]:
    current = dict(row) if row is not None else {}
    current.update(values)
    guest_id = current["guest_id"]
    fields = current["fields"]
    return {
        "contact_id": current["contact_id"],
        "guest_id": guest_id,
        "email": f"{guest_id}@{catalog.GUEST_EMAIL_DOMAIN}",
        "booking_id": current.get("booking_id"),
        "fields": json.loads(fields) if isinstance(fields, str) else fields,
    }


def _write_contact(
    conn: sqlite3.Connection, guest_id: str, contact_id: str, booking_id: str | None, merged: Any
) -> None:
    conn.execute(
        "INSERT INTO contacts VALUES (?, ?, ?, ?, ?) ON CONFLICT (guest_id) DO UPDATE SET"
        " booking_id = excluded.booking_id, fields = excluded.fields,"
        " updated_at = excluded.updated_at",
        (guest_id, contact_id, booking_id, json.dumps(merged, sort_keys=True), now_iso()),
    )


def upsert_contact(
    conn: sqlite3.Connection,
    key: str,
    guest_id: str,
    booking_id: str | None,
    fields: dict[str, Any],
) -> Outcome:
    """Create or update the guest's CRM contact, merging ``fields`` (the keyed CRM)."""
    if catalog.guest(guest_id) is None:
        return _error(404, "guest_not_found")
    row = conn.execute("SELECT * FROM contacts WHERE guest_id = ?", (guest_id,)).fetchone()
    merged = {**(json.loads(row["fields"]) if row else {}), **fields}
    contact_id = row["contact_id"] if row else _new_id("ct")
    _write_contact(conn, guest_id, contact_id, booking_id, merged)
    effect = Effect(kind="crm", idempotency_key=key, booking_id=booking_id, guest_id=guest_id)
    body = _contact_json(
        None, contact_id=contact_id, guest_id=guest_id, booking_id=booking_id, fields=merged
    )
    return Outcome(200, body, effect)


def create_contact(
    conn: sqlite3.Connection,
    key: str,
    guest_id: str,
    booking_id: str | None,
    fields: dict[str, Any],
) -> Outcome:
    """Create the guest's contact; 409 ``contact_exists`` if one has their email (HubSpot)."""
    if catalog.guest(guest_id) is None:
        return _error(404, "guest_not_found")
    row = conn.execute("SELECT * FROM contacts WHERE guest_id = ?", (guest_id,)).fetchone()
    if row is not None:
        return _error(409, "contact_exists", contact_id=row["contact_id"])
    contact_id = _new_id("ct")
    _write_contact(conn, guest_id, contact_id, booking_id, fields)
    effect = Effect(kind="crm", idempotency_key=key, booking_id=booking_id, guest_id=guest_id)
    body = _contact_json(
        None, contact_id=contact_id, guest_id=guest_id, booking_id=booking_id, fields=fields
    )
    return Outcome(201, body, effect)


def update_contact(
    conn: sqlite3.Connection,
    key: str,
    contact_id: str,
    booking_id: str | None,
    fields: dict[str, Any],
) -> Outcome:
    """Merge ``fields`` into a contact (``PATCH``): the same update twice changes nothing,
    so only an update that changes the contact is a ledger effect."""
    row = conn.execute("SELECT * FROM contacts WHERE contact_id = ?", (contact_id,)).fetchone()
    if row is None:
        return _error(404, "contact_not_found")
    before = json.loads(row["fields"])
    merged = {**before, **fields}
    changed = merged != before or booking_id != row["booking_id"]
    effect = None
    if changed:
        _write_contact(conn, row["guest_id"], contact_id, booking_id, merged)
        effect = Effect(
            kind="crm", idempotency_key=key, booking_id=booking_id, guest_id=row["guest_id"]
        )
    body = _contact_json(row, booking_id=booking_id, fields=merged)
    return Outcome(200, body, effect)


def send_email(
    conn: sqlite3.Connection, key: str, to: str, subject: str, body: str, booking_id: str | None
) -> Outcome:
    """Send (record) an email to ``to``."""
    local, at, domain = to.partition("@")
    if not (local and at and "." in domain) or any(c.isspace() for c in to):
        return _error(422, "invalid_recipient")
    email_id = _new_id("em")
    conn.execute(
        "INSERT INTO emails VALUES (?, ?, ?, ?, ?, ?)",
        (email_id, to, subject, body, booking_id, now_iso()),
    )
    effect = Effect(
        kind="email", idempotency_key=key, booking_id=booking_id, recipient=to, subject=subject
    )
    return Outcome(
        202, {"email_id": email_id, "status": "sent", "to": to, "booking_id": booking_id}, effect
    )
