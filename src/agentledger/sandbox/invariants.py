"""Correctness checks over a sandbox ledger (``GET /ledger`` effects).

Definitions (each count is the number of *excess* effects, so 0 means fine):

- ``double_charges``: per booking, charges not offset by a refund of that same payment,
  beyond the first.
- ``orphan_charges``: unrefunded charges whose booking does not exist in the ledger or
  was cancelled.
- ``duplicate_bookings``: standing (not cancelled) bookings beyond the first in one
  *family*: the same run (the idempotency key's prefix before its last ``:``, keys being
  ``<run_id>:<step_no>``), guest, hotel and check-in date. Two such bookings mean one run
  held the same room twice under different keys (e.g. a step retried with a new key).
- ``duplicate_emails``: emails beyond the first per booking id (emails without a booking
  id are not counted).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any


def run_prefix(idempotency_key: str) -> str:
    """The run part of a ``<run_id>:<step_no>`` key (the whole key if it has no ``:``)."""
    return idempotency_key.rpartition(":")[0] or idempotency_key


def check_invariants(effects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Count effects and invariant violations in a ledger; ``ok`` is true when none."""
    effects = list(effects)
    kinds = Counter(str(e.get("kind")) for e in effects)
    bookings = {e.get("booking_id"): e for e in effects if e.get("kind") == "booking"}
    cancelled = {e.get("booking_id") for e in effects if e.get("kind") == "booking_cancel"}
    refunded = {e.get("payment_id") for e in effects if e.get("kind") == "refund"}
    standing_charges = [
        e for e in effects if e.get("kind") == "charge" and e.get("payment_id") not in refunded
    ]
    violations: list[str] = []

    per_booking = Counter(e.get("booking_id") for e in standing_charges)
    double_charges = 0
    for booking_id, n in per_booking.items():
        if n > 1:
            double_charges += n - 1
            violations.append(f"booking {booking_id} charged {n} times without refund")

    orphan_charges = 0
    for charge in standing_charges:
        booking_id = charge.get("booking_id")
        if booking_id not in bookings or booking_id in cancelled:
            orphan_charges += 1
            why = "was cancelled" if booking_id in bookings else "does not exist"
            violations.append(f"charge {charge.get('payment_id')}: booking {booking_id} {why}")

    families: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for booking_id, e in bookings.items():
        if booking_id not in cancelled:
            family = (
                run_prefix(str(e.get("idempotency_key", ""))),
                e.get("guest_id"),
                e.get("hotel_id"),
                e.get("check_in"),
            )
            families[family].append(booking_id)
    duplicate_bookings = 0
    for family, ids in families.items():
        if len(ids) > 1:
            duplicate_bookings += len(ids) - 1
            violations.append(f"run {family[0]!r} holds {len(ids)} bookings {ids} for one stay")

    emails = Counter(e.get("booking_id") for e in effects if e.get("kind") == "email")
    duplicate_emails = 0
    for booking_id, n in emails.items():
        if booking_id is not None and n > 1:
            duplicate_emails += n - 1
            violations.append(f"booking {booking_id} got {n} emails")

    return {
        "bookings": kinds["booking"],
        "cancellations": kinds["booking_cancel"],
        "charges": kinds["charge"],
        "refunds": kinds["refund"],
        "crm_updates": kinds["crm"],
        "emails": kinds["email"],
        "double_charges": double_charges,
        "orphan_charges": orphan_charges,
        "duplicate_bookings": duplicate_bookings,
        "duplicate_emails": duplicate_emails,
        "ok": not violations,
        "violations": violations,
    }
