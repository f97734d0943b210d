"""Provider behaviour as strict as the real ones, over real HTTP: apply-then-error, lost
stored failures, key-less endpoints, key scope, length and expiry, lagging status
lookups, 409 while in flight, and fault counters."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx

from agentledger_examples.stayhub.sandbox import SandboxServer, check_invariants

if TYPE_CHECKING:
    from conftest import StayHub

EMAIL = {"to": "g-100@guests.stayhub.example", "subject": "Hi", "body": "Booked"}


def fired(sb: SandboxServer) -> list[int]:
    return [f["fired"] for f in sb.fault_stats()["fired"]]


def kinds(sb: SandboxServer) -> list[str]:
    return [e["kind"] for e in sb.ledger()]


def test_error_after_commit_saved_500_is_replayed_status_tells_the_truth(
    api: StayHub, sb: SandboxServer
) -> None:
    booking = api.book("run-s1:1").json()
    sb.set_faults("payments.create:error_after_commit,status=500,save=1,count=1")
    first = api.pay("run-s1:2", booking)
    assert first.status_code == 500 and first.json()["error"] == "internal_error"
    assert kinds(sb) == ["booking", "charge"]  # applied and committed nonetheless
    again = api.pay("run-s1:2", booking)  # the saved 500, as Stripe replays it
    assert again.status_code == 500 and again.headers["idempotent-replayed"] == "true"
    status = api.get("/payments/by-key/run-s1:2").json()
    assert status["status"] == "succeeded"
    assert status["response"]["payment_id"] == sb.ledger()[-1]["payment_id"]
    assert kinds(sb) == ["booking", "charge"]
    assert fired(sb) == [1]
    assert sb.fault_stats()["dropped"] == {"payments.create": 1}


def test_error_after_commit_unsaved_retry_gets_the_real_answer(
    api: StayHub, sb: SandboxServer
) -> None:
    sb.set_faults("bookings.create:error_after_commit,status=502,count=1")
    first = api.book("run-s2:1")
    assert first.status_code == 502
    retry = api.book("run-s2:1")
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
    assert retry.json()["booking_id"] == sb.ledger()[0]["booking_id"]
    assert kinds(sb) == ["booking"]


def test_lost_decline_status_check_reports_failed(
    api: StayHub, sb: SandboxServer, windows: Any
) -> None:
    # The answer is held four times longer than the client waits; a client the loaded
    # machine stalls past the hold gets the answer: a miss, tried with a longer hold.
    def lost(hold: float) -> None:
        sb.clear_faults()
        sb.reset()
        booking = api.book(f"run-s3:{hold}:1").json()
        sb.set_faults(
            f"payments.create:decline,count=1;payments.create:timeout_after_commit,hold={hold}"
        )
        body = {
            "booking_id": booking["booking_id"], "guest_id": "g-100", "amount": booking["total"]
        }  # fmt: skip
        key = f"run-s3:{hold}:2"
        window = windows.Window(hold)  # the hold begins after this
        try:
            api.post("/payments", json=body, headers={"Idempotency-Key": key}, timeout=hold / 4)
        except httpx.ReadTimeout:
            pass
        else:  # answered: a failure if the hold had surely not ended
            window.check(False)
        status = api.get(f"/payments/by-key/{key}").json()
        assert status["status"] == "failed" and status["response"] == {"error": "card_declined"}
        assert kinds(sb) == ["booking"]
        deadline = time.monotonic() + 60  # the held answer is dropped when the hold ends
        while sb.fault_stats()["dropped"] != {"payments.create": 1} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sb.fault_stats()["dropped"] == {"payments.create": 1}
        assert fired(sb) == [1, 1]

    windows.within_window(lost, first=1.0)


def test_keyless_email_sends_every_request(api: StayHub, sb: SandboxServer) -> None:
    sb.set_faults("email:keyless")
    headers = {"Idempotency-Key": "email:b1:confirmation"}
    first = api.post("/emails", json=EMAIL, headers=headers)
    second = api.post("/emails", json=EMAIL, headers=headers)  # a resend is a new email
    third = api.post("/emails", json=EMAIL)  # no key needed
    assert [r.status_code for r in (first, second, third)] == [202, 202, 202]
    assert "idempotent-replayed" not in second.headers
    assert len({r.json()["email_id"] for r in (first, second, third)}) == 3
    assert kinds(sb) == ["email", "email", "email"]
    unknown = api.get("/idempotency/email/email:b1:confirmation")
    assert unknown.status_code == 400
    assert unknown.json()["error"] == "idempotency_not_supported"
    assert fired(sb) == [3]


def test_keyless_crm_dedupes_by_email_with_409(api: StayHub, sb: SandboxServer) -> None:
    sb.set_faults("crm:keyless")
    contact = {"guest_id": "g-7", "booking_id": "bk_1", "fields": {"city": "Rome"}}
    created = api.post("/crm/contacts", json=contact, headers={"Idempotency-Key": "a"})
    assert created.status_code == 201
    contact_id = created.json()["contact_id"]
    assert created.json()["email"] == "g-7@guests.stayhub.example"
    again = api.post("/crm/contacts", json=contact, headers={"Idempotency-Key": "a"})
    assert again.status_code == 409
    assert again.json() == {"error": "contact_exists", "contact_id": contact_id}
    update = {"booking_id": "bk_1", "fields": {"city": "Rome"}}
    same = api.patch(f"/crm/contacts/{contact_id}", json=update)
    assert same.status_code == 200  # the same update again changes nothing
    changed = api.patch(f"/crm/contacts/{contact_id}", json={**update, "booking_id": "bk_2"})
    assert changed.status_code == 200 and changed.json()["booking_id"] == "bk_2"
    assert [(e["kind"], e["booking_id"]) for e in sb.ledger()] == [
        ("crm", "bk_1"),
        ("crm", "bk_2"),
    ]
    assert api.patch("/crm/contacts/ct_nope", json=update).status_code == 404


def test_keys_are_scoped_per_provider_and_endpoint(api: StayHub, sb: SandboxServer) -> None:
    booking = api.book("run-s4:1").json()
    reused = api.pay("run-s4:1", booking)  # a booking key on a payment
    assert reused.status_code == 400
    assert reused.json()["error"] == "idempotency_error"
    assert "bookings.create" in reused.json()["detail"]
    payment = api.pay("run-s4:2", booking).json()
    refund = api.post(
        f"/payments/{payment['payment_id']}/refund", headers={"Idempotency-Key": "run-s4:2"}
    )  # a charge key on a refund
    assert refund.status_code == 400 and refund.json()["error"] == "idempotency_error"
    # The mail service is another provider: its keys are its own.
    assert api.post("/emails", json=EMAIL, headers={"Idempotency-Key": "run-s4:1"}).is_success
    assert api.get("/idempotency/payments.create/run-s4:1").status_code == 404
    assert kinds(sb) == ["booking", "charge", "email"]


def test_keys_longer_than_255_are_rejected(api: StayHub, sb: SandboxServer) -> None:
    assert api.book("k" * 255).status_code == 201
    too_long = api.book("k" * 256)
    assert too_long.status_code == 400 and too_long.json()["error"] == "idempotency_error"
    assert kinds(sb) == ["booking"]


def test_keys_expire_and_a_send_after_pruning_applies_again(windows: Any) -> None:
    # The replay must come within the key's time to live; one a loaded machine sends
    # after it (not a replay) is a miss, tried again with a longer time to live.
    def expiring(ttl: float) -> None:
        with (
            SandboxServer(key_ttl=ttl) as sb,
            httpx.Client(base_url=sb.url, trust_env=False) as api,
        ):
            headers = {"Idempotency-Key": "run-s5:1"}
            window = windows.Window(ttl)  # the key is stored after this
            assert api.post("/emails", json=EMAIL, headers=headers).status_code == 202
            stored = time.monotonic()  # and before this
            replay = api.post("/emails", json=EMAIL, headers=headers)
            window.check(replay.headers.get("idempotent-replayed") == "true")
            time.sleep(max(0.0, ttl + 0.1 - (time.monotonic() - stored)))  # under test
            assert api.get("/idempotency/email/run-s5:1").json() == {"status": "not_found"}
            again = api.post("/emails", json=EMAIL, headers=headers)
            assert again.status_code == 202 and "idempotent-replayed" not in again.headers
            assert [e["kind"] for e in sb.ledger()] == ["email", "email"]

    windows.within_window(expiring)


def test_status_lookup_lags_behind_the_commit(
    api: StayHub, sb: SandboxServer, windows: Any
) -> None:
    # A first lookup a loaded machine sends after the lag ended is a miss: a longer lag
    # is tried.
    def lagging(lag: float) -> None:
        sb.clear_faults()
        sb.reset()
        key = f"run-s6:{lag}"
        sb.set_faults(f"bookings.status:lag,lag={lag}")
        window = windows.Window(lag)  # the booking commits after this
        booking = api.book(key).json()
        window.check(api.get(f"/bookings/by-key/{key}").json() == {"status": "not_found"})
        deadline = time.monotonic() + 60
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = api.get(f"/bookings/by-key/{key}").json()
            if status["status"] != "not_found":
                break
            time.sleep(0.05)
        assert status["status"] == "succeeded" and status["response"] == booking
        assert api.book(key).headers["idempotent-replayed"] == "true"  # the key was there

    windows.within_window(lagging)


async def test_in_progress_409_shape_for_a_held_refund(
    sb: SandboxServer, api: StayHub, windows: Any
) -> None:
    async def held(hold: float) -> None:
        sb.clear_faults()
        sb.reset()
        booking = api.book(f"run-s7:{hold}:1").json()
        payment = api.pay(f"run-s7:{hold}:2", booking).json()
        window = windows.Window(hold)
        sb.set_faults(f"payments.refund:hold,hold={hold},count=1")
        path = f"/payments/{payment['payment_id']}/refund"
        key = f"run-s7:{hold}:3"
        headers = {"Idempotency-Key": key}
        async with httpx.AsyncClient(base_url=sb.url, trust_env=False, timeout=60) as client:
            first = asyncio.create_task(client.post(path, headers=headers))
            try:
                status: dict[str, Any] = {}
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    status = (await client.get(f"/idempotency/payments.refund/{key}")).json()
                    if status != {"status": "not_found"}:
                        break
                    await asyncio.sleep(0.02)
                window.check(status == {"status": "pending"})
                busy = await client.post(path, headers=headers)
                window.check(busy.status_code == 409)
                assert busy.json() == {"error": "request_in_progress"}
                assert busy.headers["retry-after"] == "1"
            finally:
                done = await first
            assert done.status_code == 201
        assert kinds(sb) == ["booking", "charge", "refund"]

    await windows.within_window_async(held)


def test_run_id_header_is_recorded_and_finds_duplicate_bookings(
    api: StayHub, sb: SandboxServer
) -> None:
    for key in ("alpha:1", "beta:7"):  # keys that share nothing: the header tells the run
        response = api.post(
            "/bookings", json=api.stay, headers={"Idempotency-Key": key, "X-Run-Id": "run-x"}
        )
        assert response.status_code == 201
    assert [e["run_id"] for e in sb.ledger()] == ["run-x", "run-x"]
    result = check_invariants(sb.ledger())
    assert result["duplicate_bookings"] == 1


def test_a_fault_counts_the_requests_it_met_apart_from_its_firings(
    api: StayHub, sb: SandboxServer
) -> None:
    """A fault that never met its operation had no chance; one that met it and never
    fired did (the demo's verdict tells them apart)."""
    sb.set_faults("payments.refund:hold,hold=1;bookings.create:error@0.0")
    api.book("run-m1:1")
    stats = {f["fault"]: (f["met"], f["fired"]) for f in sb.fault_stats()["fired"]}
    assert stats["payments.refund:hold,hold=1"] == (0, 0)  # no refund was asked for
    assert stats["bookings.create:error@0"] == (1, 0)  # met, and did not fire
