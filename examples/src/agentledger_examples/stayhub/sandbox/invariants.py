"""Correctness checks over a sandbox ledger (``GET /ledger`` effects).

Each count is a number of offending effects, so 0 means fine. A charge *stands* unless a
refund of that payment exists; a booking *stands* unless it was cancelled.

Money:

- ``double_charges``: per booking, standing charges beyond the first.
- ``orphan_charges``: standing charges whose booking does not exist or was cancelled.
- ``wrong_amount_charges``: charges (refunded or not) whose amount or currency differs
  from the booking's price. The payments provider charges what it is sent, as Stripe
  does, so only the ledger can tell.
- ``unpaid_bookings``: standing bookings with no standing charge at the end.

Messages:

- ``misaddressed_emails``: emails about a booking sent to anyone but the verified
  address of that booking's guest.
- ``emails_for_unconfirmed``: emails about a booking that was cancelled, never paid, or
  does not exist.
- ``duplicate_emails``: emails beyond the first per booking id; an email without a booking
  id is a duplicate of an earlier one of the same run to the same recipient with the same
  subject.
- ``duplicate_crm_writes``: CRM writes beyond the first per booking id; without a
  booking id, per run and guest.

Bookings:

- ``duplicate_bookings``: standing bookings beyond the first per *family*: the same run
  (the ``X-Run-Id`` header the runtime sent, recorded as ``run_id``; never parsed from the
  key), guest, hotel and check-in date. Two such bookings mean one run held the same room
  twice under different keys. Bookings without a run id are not grouped.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from agentledger_examples.stayhub.sandbox import catalog

INVARIANTS: tuple[str, ...] = (
    "double_charges",
    "orphan_charges",
    "wrong_amount_charges",
    "unpaid_bookings",
    "misaddressed_emails",
    "emails_for_unconfirmed",
    "duplicate_emails",
    "duplicate_crm_writes",
    "duplicate_bookings",
)
"""Every invariant :func:`check_invariants` counts, in report order."""

Effect = Mapping[str, Any]


def _excess(groups: Mapping[Any, int]) -> dict[Any, int]:
    return {group: n - 1 for group, n in groups.items() if n > 1}


def check_invariants(effects: Iterable[Effect]) -> dict[str, Any]:
    """Count effects and invariant violations in a ledger; ``ok`` is true when none."""
    effects = list(effects)
    kinds = Counter(str(e.get("kind")) for e in effects)
    of_kind: dict[str, list[Effect]] = defaultdict(list)
    for e in effects:
        of_kind[str(e.get("kind"))].append(e)
    bookings = {e.get("booking_id"): e for e in of_kind["booking"]}
    cancelled = {e.get("booking_id") for e in of_kind["booking_cancel"]}
    refunded = {e.get("payment_id") for e in of_kind["refund"]}
    standing_charges = [e for e in of_kind["charge"] if e.get("payment_id") not in refunded]
    paid = {e.get("booking_id") for e in standing_charges}
    counts: dict[str, int] = dict.fromkeys(INVARIANTS, 0)
    violations: list[str] = []

    def violate(invariant: str, message: str, n: int = 1) -> None:
        counts[invariant] += n
        violations.append(message)

    # --- money ---------------------------------------------------------------------------
    charges_per_booking = Counter(e.get("booking_id") for e in standing_charges)
    for booking_id, extra in _excess(charges_per_booking).items():
        violate("double_charges", f"booking {booking_id} charged {extra + 1} times", extra)
    for charge in standing_charges:
        booking_id = charge.get("booking_id")
        if booking_id not in bookings or booking_id in cancelled:
            why = "was cancelled" if booking_id in bookings else "does not exist"
            violate(
                "orphan_charges", f"charge {charge.get('payment_id')}: booking {booking_id} {why}"
            )
    for charge in of_kind["charge"]:
        booking = bookings.get(charge.get("booking_id"))
        if booking is None:
            continue
        price = (booking.get("amount"), booking.get("currency"))
        if (charge.get("amount"), charge.get("currency")) != price:
            violate(
                "wrong_amount_charges",
                f"charge {charge.get('payment_id')} of {charge.get('amount')} "
                f"{charge.get('currency')} for booking {booking.get('booking_id')} priced "
                f"{price[0]} {price[1]}",
            )
    for booking_id in bookings:
        if booking_id not in cancelled and booking_id not in paid:
            violate("unpaid_bookings", f"booking {booking_id} stands unpaid")

    # --- messages ------------------------------------------------------------------------
    for email in of_kind["email"]:
        booking_id = email.get("booking_id")
        if booking_id is None:
            continue
        booking = bookings.get(booking_id)
        guest = catalog.guest(str(booking.get("guest_id"))) if booking else None
        if guest is not None and email.get("recipient") != guest["email"]:
            violate(
                "misaddressed_emails",
                f"email about {booking_id} went to {email.get('recipient')}, not {guest['email']}",
            )
        if booking is None or booking_id in cancelled or booking_id not in paid:
            why = (
                "does not exist"
                if booking is None
                else "was cancelled"
                if booking_id in cancelled
                else "was never paid"
            )
            violate("emails_for_unconfirmed", f"email about booking {booking_id}, which {why}")
    email_groups = Counter(
        ("booking", e["booking_id"])
        if e.get("booking_id") is not None
        else ("run", e.get("run_id"), e.get("recipient"), e.get("subject"))
        for e in of_kind["email"]
    )
    for group, extra in _excess(email_groups).items():
        violate("duplicate_emails", f"{extra + 1} emails for {group[1:]}", extra)
    crm_groups = Counter(
        ("booking", e["booking_id"])
        if e.get("booking_id") is not None
        else ("run", e.get("run_id"), e.get("guest_id"))
        for e in of_kind["crm"]
    )
    for group, extra in _excess(crm_groups).items():
        violate("duplicate_crm_writes", f"{extra + 1} CRM writes for {group[1:]}", extra)

    # --- bookings ------------------------------------------------------------------------
    families: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for booking_id, e in bookings.items():
        if booking_id not in cancelled and e.get("run_id") is not None:
            family = (e.get("run_id"), e.get("guest_id"), e.get("hotel_id"), e.get("check_in"))
            families[family].append(booking_id)
    for family, ids in families.items():
        if len(ids) > 1:
            violate(
                "duplicate_bookings",
                f"run {family[0]!r} holds {len(ids)} bookings {ids} for one stay",
                len(ids) - 1,
            )

    return {
        "bookings": kinds["booking"],
        "cancellations": kinds["booking_cancel"],
        "charges": kinds["charge"],
        "refunds": kinds["refund"],
        "crm_updates": kinds["crm"],
        "emails": kinds["email"],
        **counts,
        "ok": not violations,
        "violations": violations,
    }
