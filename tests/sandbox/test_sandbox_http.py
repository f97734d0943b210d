"""The sandbox over real HTTP on loopback (one subprocess per module)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

import httpx

from agentledger_examples.stayhub.sandbox import SandboxServer, check_invariants

if TYPE_CHECKING:
    from conftest import StayHub


def test_catalogue_guests_and_health(api: StayHub) -> None:
    assert api.get("/healthz").json()["ok"] is True
    lisbon = api.get("/hotels", params={"city": "Lisbon", "nights": 2}).json()["hotels"]
    assert 3 <= len(lisbon) <= 5
    assert lisbon == api.get("/hotels", params={"city": "lisbon", "nights": 2}).json()["hotels"]
    first = lisbon[0]
    assert first["price_per_night"]["currency"] == "EUR"
    assert isinstance(first["price_per_night"]["amount"], int)
    assert api.get("/hotels", params={"city": "Atlantis"}).json()["hotels"] == []
    avail = api.get(
        f"/hotels/{first['hotel_id']}/availability", params={"check_in": "2031-05-01", "nights": 3}
    ).json()
    assert avail["available"] is True and avail["rooms_left"] > 0
    assert avail["total"]["amount"] == 3 * first["price_per_night"]["amount"]
    guest = api.get("/guests/g-123").json()
    assert guest["email"] == "g-123@guests.stayhub.example"
    assert api.get("/guests/not a guest").status_code == 404
    assert api.get("/hotels/h-nope/availability", params={"check_in": "2031-05-01"}).json() == {
        "error": "hotel_not_found"
    }


def test_missing_key_and_invalid_body(api: StayHub, sb: SandboxServer) -> None:
    response = api.post("/bookings", json=api.stay)
    assert response.status_code == 400
    assert response.json()["error"] == "missing_idempotency_key"
    bad = api.post("/bookings", json={"hotel_id": "h-lis-1"}, headers={"Idempotency-Key": "k"})
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"
    assert sb.ledger() == []


def test_idempotent_replay_has_one_effect(api: StayHub, sb: SandboxServer) -> None:
    first = api.book("run-a:1")
    second = api.book("run-a:1")
    assert first.status_code == second.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert second.headers["idempotent-replayed"] == "true"
    assert second.json() == first.json()
    assert first.json()["total"]["amount"] > 0
    effects = sb.ledger()
    assert [e["kind"] for e in effects] == ["booking"]
    assert effects[0]["guest_id"] == api.stay["guest_id"]
    assert effects[0]["idempotency_key"] == "run-a:1"


def test_key_reuse_with_other_parameters_is_rejected(api: StayHub) -> None:
    assert api.book("run-b:1").status_code == 201
    reused = api.book("run-b:1", nights=3)
    assert reused.status_code == 422
    assert reused.json() == {"error": "idempotency_key_reuse"}


def test_status_by_key(api: StayHub) -> None:
    assert api.get("/bookings/by-key/run-c:1").status_code == 404
    assert api.get("/bookings/by-key/run-c:1").json() == {"status": "not_found"}
    booking = api.book("run-c:1").json()
    status = api.get("/bookings/by-key/run-c:1").json()
    assert status["status"] == "succeeded" and status["response"] == booking
    api.pay("run-c:2", booking)
    assert api.get("/payments/by-key/run-c:2").json()["status"] == "succeeded"
    assert api.get(f"/bookings/{booking['booking_id']}").json()["status"] == "confirmed"
    generic = api.get("/idempotency/bookings.create/run-c:1").json()
    assert generic["response"] == booking


async def test_in_progress_and_pending_while_held(
    sb: SandboxServer, api: StayHub, windows: Any
) -> None:
    """While a request is held, its key's status is pending, a second request with the
    key is refused 409 and nothing is applied; then the first applies once."""

    async def held(hold: float) -> None:
        sb.clear_faults()
        sb.reset()
        key = f"run-d:{hold}"
        window = windows.Window(hold)
        sb.set_faults(f"bookings.create:hold,hold={hold},count=1")
        async with httpx.AsyncClient(base_url=sb.url, trust_env=False, timeout=60) as client:
            headers = {"Idempotency-Key": key}
            first = asyncio.create_task(client.post("/bookings", json=api.stay, headers=headers))
            try:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # until the held request reached the sandbox
                    status = (await client.get(f"/bookings/by-key/{key}")).json()
                    if status != {"status": "not_found"}:
                        break
                    await asyncio.sleep(0.02)
                window.check(status == {"status": "pending"})
                concurrent = await client.post("/bookings", json=api.stay, headers=headers)
                window.check(concurrent.status_code == 409)
                assert concurrent.json() == {"error": "request_in_progress"}
                window.check(sb.ledger() == [])
            finally:
                done = await first
            assert done.status_code == 201
            status = (await client.get(f"/bookings/by-key/{key}")).json()
            assert status["status"] == "succeeded" and status["response"] == done.json()
        assert len(sb.ledger()) == 1

    await windows.within_window_async(held)


async def test_concurrent_same_key_applies_once(sb: SandboxServer, api: StayHub) -> None:
    async with httpx.AsyncClient(base_url=sb.url, trust_env=False, timeout=5) as client:
        headers = {"Idempotency-Key": "run-e:1"}
        responses = await asyncio.gather(
            *(client.post("/bookings", json=api.stay, headers=headers) for _ in range(10))
        )
    codes = sorted(r.status_code for r in responses)
    assert set(codes) <= {201, 409} and 201 in codes
    ids = {r.json()["booking_id"] for r in responses if r.status_code == 201}
    assert len(ids) == 1
    assert len(sb.ledger()) == 1


def test_timeout_after_commit(api: StayHub, sb: SandboxServer, windows: Any) -> None:
    # The answer is held four times longer than the client waits; a client the loaded
    # machine stalls past the hold gets the answer: a miss, tried again with a longer hold.
    # The sandbox says when the hold ended the client was gone: the answer was dropped,
    # never delivered.
    def dropped(hold: float) -> None:
        sb.clear_faults()
        sb.reset()
        key = f"run-f:{hold}"
        sb.set_faults(f"bookings.create:timeout_after_commit,hold={hold}")
        window = windows.Window(hold)  # the hold begins after this
        try:
            api.book(key, timeout=hold / 4)
        except httpx.ReadTimeout:
            pass
        else:  # answered: a failure if the hold had surely not ended
            window.check(False)
        deadline = time.monotonic() + 60
        while sb.fault_stats()["dropped"] != {"bookings.create": 1} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sb.fault_stats()["dropped"] == {"bookings.create": 1}
        effects = sb.ledger()
        assert [(e["kind"], e["idempotency_key"]) for e in effects] == [("booking", key)]
        status = api.get(f"/bookings/by-key/{key}").json()
        assert status["status"] == "succeeded"
        assert status["response"]["booking_id"] == effects[0]["booking_id"]
        sb.clear_faults()
        retry = api.book(key)  # the retry with the same key is a replay
        assert retry.headers["idempotent-replayed"] == "true"
        assert len(sb.ledger()) == 1

    windows.within_window(dropped, first=1.0)


def test_rate_limit_with_retry_after(api: StayHub, sb: SandboxServer) -> None:
    sb.set_faults("bookings.create:rate_limit,retry_after=2,count=1")
    limited = api.book("run-g:1")
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "2"
    assert limited.json()["error"] == "rate_limited"
    assert api.get("/bookings/by-key/run-g:1").json() == {"status": "not_found"}
    assert api.book("run-g:1").status_code == 201
    assert len(sb.ledger()) == 1


def test_error_fails_first_requests_without_effect(api: StayHub, sb: SandboxServer) -> None:
    sb.set_faults("email:error,count=2;payments.status:error,status=500")
    body = {"to": "g-1@guests.stayhub.example", "subject": "Hi", "body": "Booked"}
    headers = {"Idempotency-Key": "run-h:1"}
    codes = [api.post("/emails", json=body, headers=headers).status_code for _ in range(3)]
    assert codes == [503, 503, 202]
    assert api.get("/payments/by-key/x").status_code == 500
    effects = sb.ledger()
    assert [(e["kind"], e["recipient"]) for e in effects] == [("email", body["to"])]


def test_outage_window(api: StayHub, sb: SandboxServer, windows: Any) -> None:
    # A request sent after the outage ended (a loaded machine) is a miss: a longer outage
    # is tried.
    def outage(duration: float) -> None:
        window = windows.Window(duration)
        sb.set_faults(f"search:outage,duration={duration}")
        installed = time.monotonic()  # the outage began before this
        during = api.get("/hotels", params={"city": "Porto"})
        window.check(during.status_code == 503)
        assert during.json() == {"error": "outage"}
        left = int(during.headers["retry-after"])  # what is left of it, rounded up
        assert 1 <= left <= math.ceil(duration)
        time.sleep(max(0.0, duration + 0.1 - (time.monotonic() - installed)))
        assert api.get("/hotels", params={"city": "Porto"}).status_code == 200

    windows.within_window(outage, first=1.0)


def test_decline_is_a_stored_business_error(api: StayHub, sb: SandboxServer) -> None:
    booking = api.book("run-i:1").json()
    sb.set_faults("payments.create:decline,count=1")
    declined = api.pay("run-i:2", booking)
    assert declined.status_code == 402 and declined.json() == {"error": "card_declined"}
    replay = api.pay("run-i:2", booking)  # the stored answer, although the fault is spent
    assert replay.status_code == 402 and replay.headers["idempotent-replayed"] == "true"
    assert api.get("/payments/by-key/run-i:2").json()["status"] == "failed"
    assert api.pay("run-i:3", booking).status_code == 201
    assert [e["kind"] for e in sb.ledger()] == ["booking", "charge"]


def test_payments_charge_what_they_are_sent(api: StayHub, sb: SandboxServer) -> None:
    """Like Stripe, the payments provider knows nothing of bookings: a wrong amount is
    charged, and recorded beside the booking's price for the ledger checks."""
    booking = api.book("run-j:1").json()
    price = booking["total"]["amount"]
    wrong = {"amount": price - 1, "currency": "EUR"}
    response = api.pay("run-j:2", booking, amount=wrong)
    assert response.status_code == 201
    assert response.json()["amount"] == wrong
    charge = sb.ledger()[-1]
    assert (charge["kind"], charge["amount"], charge["expected_amount"]) == (
        "charge",
        price - 1,
        price,
    )
    assert check_invariants(sb.ledger())["wrong_amount_charges"] == 1


def test_sold_out_cancel_and_refund(api: StayHub, sb: SandboxServer) -> None:
    params = {"check_in": api.stay["check_in"], "nights": api.stay["nights"]}
    rooms = api.get("/hotels/h-lis-1/availability", params=params).json()["rooms_left"]
    bookings = [api.book(f"run-k{n}:1", guest_id=f"g-{n}").json() for n in range(rooms)]
    sold_out = api.book("run-k:extra")
    assert sold_out.status_code == 409 and sold_out.json() == {"error": "sold_out"}
    assert api.book("run-k:extra").headers["idempotent-replayed"] == "true"
    assert api.get("/hotels/h-lis-1/availability", params=params).json()["available"] is False

    payment = api.pay("run-k0:2", bookings[0]).json()
    headers = {"Idempotency-Key": "run-k0:3"}
    refund = api.post(f"/payments/{payment['payment_id']}/refund", headers=headers)
    assert refund.status_code == 201 and refund.json()["payment_id"] == payment["payment_id"]
    cancel_path = f"/bookings/{bookings[0]['booking_id']}/cancel"
    cancelled = api.post(cancel_path, headers={"Idempotency-Key": "run-k0:4"})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert api.post(cancel_path, headers={"Idempotency-Key": "run-k0:4"}).status_code == 200
    assert api.get("/hotels/h-lis-1/availability", params=params).json()["rooms_left"] == 1
    assert api.book("run-k:extra2").status_code == 201

    kinds = [e["kind"] for e in sb.ledger()]
    assert kinds.count("booking") == rooms + 1
    assert kinds.count("booking_cancel") == kinds.count("refund") == kinds.count("charge") == 1


def test_fault_control_endpoint(api: StayHub, sb: SandboxServer) -> None:
    put = api.put("/faults", json={"spec": "crm:latency,ms=10;seed=5"})
    assert put.status_code == 200
    assert api.get("/faults").json() == {
        "seed": 5,
        "faults": [{"endpoint": "crm", "kind": "latency", "probability": 1.0, "ms": 10.0}],
        "stats": {"fired": [{"fault": "crm:latency,ms=10", "fired": 0, "met": 0}], "dropped": {}},
    }
    bad = api.put("/faults", json={"faults": [{"endpoint": "nope", "kind": "error"}]})
    assert bad.status_code == 422 and "unknown endpoint" in bad.json()["detail"]
    assert api.delete("/faults").json() == {"seed": 0, "faults": []}
