"""check_invariants on hand-built ledgers."""

from __future__ import annotations

from typing import Any

from agentledger_examples.stayhub.sandbox import INVARIANTS, check_invariants

ADDRESS = "g-1@guests.stayhub.example"


def effect(kind: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "idempotency_key": key, **fields}


STAY = {"guest_id": "g-1", "hotel_id": "h-lis-1", "check_in": "2031-05-01"}
PRICE = {"amount": 100, "currency": "EUR"}


def booking(booking_id: str, run: str, **fields: Any) -> dict[str, Any]:
    return effect(
        "booking", f"{run}:1", booking_id=booking_id, run_id=run, **{**STAY, **PRICE, **fields}
    )


def charge(booking_id: str, payment_id: str, **fields: Any) -> dict[str, Any]:
    return effect(
        "charge", "k", booking_id=booking_id, payment_id=payment_id, **{**PRICE, **fields}
    )


def only(result: dict[str, Any], **expected: int) -> None:
    """Exactly these invariants are broken, by these counts."""
    broken = {k: result[k] for k in INVARIANTS if result[k]}
    assert broken == expected, result["violations"]
    assert result["ok"] is (not expected)


def test_clean_ledger_is_ok() -> None:
    ledger = [
        booking("b1", "r1"),
        charge("b1", "p1"),
        effect("email", "r1:3", booking_id="b1", recipient=ADDRESS),
        effect("crm", "r1:4", booking_id="b1", guest_id="g-1"),
    ]
    result = check_invariants(ledger)
    only(result)
    assert (result["bookings"], result["charges"], result["emails"]) == (1, 1, 1)


def test_double_charge_and_orphan_charge() -> None:
    ledger = [
        booking("b1", "r1"),
        charge("b1", "p1"),
        charge("b1", "p2"),  # double
        booking("b2", "r2", guest_id="g-2"),
        effect("booking_cancel", "r2:3", booking_id="b2"),
        charge("b2", "p3"),  # orphan: the booking was cancelled
        charge("nope", "p4"),  # orphan: no such booking
    ]
    result = check_invariants(ledger)
    only(result, double_charges=1, orphan_charges=2)
    assert any("b2" in v and "cancelled" in v for v in result["violations"])
    assert any("nope" in v and "does not exist" in v for v in result["violations"])


def test_refunds_offset_charges() -> None:
    ledger = [
        booking("b1", "r1"),
        charge("b1", "p1"),
        charge("b1", "p2"),
        effect("refund", "r1:4", booking_id="b1", payment_id="p2", amount=100),
        booking("b2", "r2", guest_id="g-2"),
        charge("b2", "p3"),
        effect("refund", "r2:4", booking_id="b2", payment_id="p3", amount=100),
        effect("booking_cancel", "r2:5", booking_id="b2"),
    ]
    result = check_invariants(ledger)
    only(result)
    assert (result["charges"], result["refunds"], result["cancellations"]) == (3, 2, 1)


def test_wrong_amount_and_unpaid_bookings() -> None:
    ledger = [
        booking("b1", "r1"),
        charge("b1", "p1", amount=1),  # not the booking's price
        booking("b2", "r2", guest_id="g-2"),
        charge("b2", "p2", currency="USD"),
        effect("refund", "r2:3", booking_id="b2", payment_id="p2"),  # refunded: still wrong
        effect("booking_cancel", "r2:4", booking_id="b2"),
        booking("b3", "r3", guest_id="g-3"),  # stands, never paid
        booking("b4", "r4", guest_id="g-4"),
        effect("booking_cancel", "r4:2", booking_id="b4"),  # cancelled unpaid: fine
    ]
    only(check_invariants(ledger), wrong_amount_charges=2, unpaid_bookings=1)


def test_emails_to_the_wrong_address_or_about_unconfirmed_bookings() -> None:
    ledger = [
        booking("b1", "r1"),
        charge("b1", "p1"),
        effect("email", "e1", booking_id="b1", recipient="refunds@attacker.example"),
        booking("b2", "r2"),
        charge("b2", "p2"),
        effect("refund", "r2:3", booking_id="b2", payment_id="p2"),
        effect("booking_cancel", "r2:4", booking_id="b2"),
        effect("email", "e2", booking_id="b2", recipient=ADDRESS),  # cancelled
        booking("b3", "r3"),
        effect("booking_cancel", "r3:2", booking_id="b3"),
        effect("email", "e3", booking_id="b3", recipient=ADDRESS),  # cancelled, never paid
        effect("email", "e4", booking_id="b-none", recipient=ADDRESS),  # no such booking
    ]
    only(check_invariants(ledger), misaddressed_emails=1, emails_for_unconfirmed=3)


def test_duplicate_bookings_emails_and_crm_writes() -> None:
    ledger = [
        booking("b1", "r1"),
        booking("b2", "r1"),  # same run (by its X-Run-Id), same stay
        booking("b3", "r2"),  # another run: not a duplicate
        booking("b4", "r3"),
        effect("booking_cancel", "r3:2", booking_id="b4"),
        booking("b5", "r3"),  # rebooked after cancel: fine
        {**booking("b6", "x"), "run_id": None},  # no run id: not grouped
        {**booking("b7", "x"), "run_id": None},
        *(charge(b, f"p-{b}") for b in ("b1", "b2", "b3", "b5", "b6", "b7")),
        effect("email", "e1", booking_id="b1", recipient=ADDRESS),
        effect("email", "e2", booking_id="b1", recipient=ADDRESS),  # duplicate
        effect("email", "e3", run_id="r9", recipient=ADDRESS, subject="Hi"),
        effect("email", "e4", run_id="r9", recipient=ADDRESS, subject="Hi"),  # duplicate
        effect("email", "e5", run_id="r9", recipient=ADDRESS, subject="Bye"),
        effect("crm", "c1", booking_id="b1", guest_id="g-1"),
        effect("crm", "c2", booking_id="b1", guest_id="g-1"),  # duplicate
        effect("crm", "c3", run_id="r9", guest_id="g-1"),
        effect("crm", "c4", run_id="r9", guest_id="g-1"),  # duplicate, no booking id
    ]
    only(
        check_invariants(ledger),
        duplicate_bookings=1,
        duplicate_emails=2,
        duplicate_crm_writes=2,
    )
