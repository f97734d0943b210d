"""check_invariants on hand-built ledgers."""

from __future__ import annotations

from typing import Any

from agentledger.sandbox import check_invariants


def effect(kind: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "idempotency_key": key, **fields}


STAY = {"guest_id": "g-1", "hotel_id": "h-lis-1", "check_in": "2031-05-01"}


def test_clean_ledger_is_ok() -> None:
    ledger = [
        effect("booking", "r1:1", booking_id="b1", **STAY),
        effect("charge", "r1:2", booking_id="b1", payment_id="p1", amount=100),
        effect("email", "r1:3", booking_id="b1", recipient="g-1@x.example"),
        effect("crm", "r1:4", booking_id="b1", guest_id="g-1"),
    ]
    result = check_invariants(ledger)
    assert result["ok"] is True
    assert (result["bookings"], result["charges"], result["emails"]) == (1, 1, 1)


def test_double_charge_and_orphan_charge() -> None:
    ledger = [
        effect("booking", "r1:1", booking_id="b1", **STAY),
        effect("charge", "r1:2", booking_id="b1", payment_id="p1", amount=100),
        effect("charge", "r1:3", booking_id="b1", payment_id="p2", amount=100),  # double
        effect("booking", "r2:1", booking_id="b2", **{**STAY, "guest_id": "g-2"}),
        effect("booking_cancel", "r2:3", booking_id="b2"),
        effect("charge", "r2:2", booking_id="b2", payment_id="p3", amount=100),  # orphan
        effect("charge", "r3:2", booking_id="nope", payment_id="p4", amount=100),  # orphan
    ]
    result = check_invariants(ledger)
    assert result["double_charges"] == 1
    assert result["orphan_charges"] == 2
    assert result["ok"] is False
    assert any("b2" in v and "cancelled" in v for v in result["violations"])
    assert any("nope" in v and "does not exist" in v for v in result["violations"])


def test_refunds_offset_charges() -> None:
    ledger = [
        effect("booking", "r1:1", booking_id="b1", **STAY),
        effect("charge", "r1:2", booking_id="b1", payment_id="p1", amount=100),
        effect("charge", "r1:3", booking_id="b1", payment_id="p2", amount=100),
        effect("refund", "r1:4", booking_id="b1", payment_id="p2", amount=100),
        effect("booking", "r2:1", booking_id="b2", **{**STAY, "guest_id": "g-2"}),
        effect("charge", "r2:2", booking_id="b2", payment_id="p3", amount=100),
        effect("refund", "r2:4", booking_id="b2", payment_id="p3", amount=100),
        effect("booking_cancel", "r2:5", booking_id="b2"),
    ]
    result = check_invariants(ledger)
    assert result["ok"] is True, result["violations"]
    assert (result["charges"], result["refunds"], result["cancellations"]) == (3, 2, 1)


def test_duplicate_bookings_and_emails() -> None:
    ledger = [
        effect("booking", "r1:1", booking_id="b1", **STAY),
        effect("booking", "r1:4", booking_id="b2", **STAY),  # same run, same stay
        effect("booking", "r2:1", booking_id="b3", **STAY),  # another run: not a duplicate
        effect("booking", "r3:1", booking_id="b4", **STAY),
        effect("booking_cancel", "r3:2", booking_id="b4"),
        effect("booking", "r3:3", booking_id="b5", **STAY),  # rebooked after cancel: fine
        effect("email", "r1:5", booking_id="b1", recipient="a@x.example"),
        effect("email", "r1:6", booking_id="b1", recipient="a@x.example"),
        effect("email", "r1:7", recipient="a@x.example"),  # no booking id: not counted
    ]
    result = check_invariants(ledger)
    assert result["duplicate_bookings"] == 1
    assert result["duplicate_emails"] == 1
    assert result["double_charges"] == result["orphan_charges"] == 0
