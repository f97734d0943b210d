"""The StayHub booking app: tools with contracts over the sandbox, and the booking agent.

Environment (read when the module is imported, so a worker process picks it up):

- ``STAYHUB_URL``: the sandbox base URL (default ``http://127.0.0.1:8700``).
- ``STAYHUB_SEARCH_TIMEOUT`` (default 2), ``STAYHUB_BOOKING_TIMEOUT`` (5),
  ``STAYHUB_PAYMENT_TIMEOUT`` (10), ``STAYHUB_NOTIFY_TIMEOUT`` (3): tool timeouts in
  seconds. Tests shorten them so a ``timeout_after_commit`` hold costs less wall time.
- ``STAYHUB_MANAGER_APPROVAL_SECONDS`` (default 86400): how long a corporate booking waits
  for a manager before the default (reject) applies.

Corporate bookings (input ``company_id``): the policy puts ``create_booking`` behind a
``manager`` approval instead of the guest's own (a tool's declared approval applies only
when the policy allows the call); the payment stays behind the guest's approval. A
booking the manager rejects, or that nobody approves in time, ends the run with one email
telling the guest.

Every request carries the run's id in ``X-Run-Id`` (the sandbox ledger groups effects by
it) and every write its step's ``Idempotency-Key``. A 409 ``request_in_progress`` (the same
key's first request is still running) is :class:`~agentledger.errors.InProgress`, never a
business failure, and status checks report it as ``pending``. ``send_email`` goes through
the engine's effects table (``idempotency="effects"``): mail services such as SendGrid
have no idempotency key, so the sandbox's mail endpoint may ignore it (``email:keyless``).
The CRM may dedupe by email with 409 ``contact_exists`` (``crm:keyless``, as HubSpot):
the CRM tool then updates the existing contact.

Declined payments: the scripted model cancels the booking itself with ``cancel_booking``
(a normal write tool) and then answers; for budget and other handovers the runtime runs
each succeeded write step's declared compensation (``cancel_booking`` for a booking,
``refund_payment`` for a charge), newest first.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
from pydantic import BaseModel, Field

from agentledger import (
    Agent,
    Allow,
    App,
    Budget,
    Decision,
    ProposedCall,
    RequireApproval,
    ScriptedModel,
)
from agentledger.errors import BusinessError, InProgress
from agentledger.tools import Compensation, RetryPolicy, Status, ToolContext, call_provider
from agentledger_examples.stayhub.script import booking_script

DEFAULT_URL = "http://127.0.0.1:8700"


def _seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


SEARCH_TIMEOUT = _seconds("STAYHUB_SEARCH_TIMEOUT", 2.0)
BOOKING_TIMEOUT = _seconds("STAYHUB_BOOKING_TIMEOUT", 5.0)
PAYMENT_TIMEOUT = _seconds("STAYHUB_PAYMENT_TIMEOUT", 10.0)
NOTIFY_TIMEOUT = _seconds("STAYHUB_NOTIFY_TIMEOUT", 3.0)
MANAGER_APPROVAL_SECONDS = _seconds("STAYHUB_MANAGER_APPROVAL_SECONDS", 86400.0)

app = App("stayhub")


@app.on_startup
async def _open_client(a: App) -> None:
    url = os.environ.get("STAYHUB_URL", DEFAULT_URL).rstrip("/")
    a.resources["stayhub_url"] = url
    a.resources["stayhub_http"] = httpx.AsyncClient(base_url=url, trust_env=False, timeout=30.0)


@app.on_shutdown
async def _close_client(a: App) -> None:
    client = a.resources.pop("stayhub_http", None)
    if client is not None:
        await client.aclose()


def _client(ctx: ToolContext) -> httpx.AsyncClient:
    client = ctx.resources.get("stayhub_http")
    if not isinstance(client, httpx.AsyncClient):
        raise RuntimeError("the StayHub HTTP client is not open (app startup did not run)")
    return client


RUN_ID_HEADER = "X-Run-Id"
IN_PROGRESS = "request_in_progress"


async def _get(ctx: ToolContext, path: str, **params: Any) -> Any:
    response = await call_provider(
        _client(ctx),
        "GET",
        path,
        params=params or None,
        headers={RUN_ID_HEADER: ctx.run_id},
        timeout=max(0.05, ctx.time_left()),
    )
    return response.json()


async def _post(
    ctx: ToolContext, path: str, body: Any = None, method: str = "POST", key_suffix: str = ""
) -> Any:
    try:
        response = await call_provider(
            _client(ctx),
            method,
            path,
            json=body,
            headers={
                "Idempotency-Key": ctx.idempotency_key + key_suffix,
                RUN_ID_HEADER: ctx.run_id,
            },
            timeout=max(0.05, ctx.time_left()),
        )
    except BusinessError as exc:
        if isinstance(exc.data, dict) and exc.data.get("error") == IN_PROGRESS:
            # 409: the same key's first request still runs. Not an answer: wait and check.
            raise InProgress(f"{method} {path}: {IN_PROGRESS}", data=exc.data) from None
        raise
    return response.json()


async def _status_by_key(ctx: ToolContext, path: str) -> Status:
    """Map the sandbox's status-by-key answer to a :class:`Status`.

    Only a 404 is ``not_found`` (send again with the same key). Anything else that is not
    a 200, such as a key-less provider's 400 ``idempotency_not_supported``, is ``pending``:
    nobody can tell, so the engine keeps asking and then hands the step to a human rather
    than send twice.
    """
    try:
        response = await _client(ctx).get(
            path, headers={RUN_ID_HEADER: ctx.run_id}, timeout=max(0.05, ctx.time_left())
        )
    except httpx.HTTPError:
        return Status.pending()  # could not ask: ask again later
    if response.status_code == 404:
        return Status.not_found()
    if response.status_code != 200:
        return Status.pending()
    body = response.json()
    state = body.get("status")
    if state == "succeeded":
        return Status.succeeded(body.get("response"))
    if state == "failed":
        detail = body.get("response")
        error = detail.get("error") if isinstance(detail, dict) else None
        return Status.failed(str(error or detail or "failed"))
    if state == "not_found":
        return Status.not_found()
    return Status.pending()


# --- reads ---------------------------------------------------------------------------------


# Reads are safe to repeat: a provider that is slow for a moment (a timeout) is asked
# again a few times, so a busy minute does not end a booking before it starts.
READ_RETRY = RetryPolicy(provider_error=2, rate_limited=3, timeout=3)


@app.tool(effect="read", timeout=SEARCH_TIMEOUT, retry=READ_RETRY)
async def search_hotels(ctx: ToolContext, city: str, nights: int = 1) -> dict[str, Any]:
    """Hotels in a city with their price per night and the total for the stay."""
    result: dict[str, Any] = await _get(ctx, "/hotels", city=city, nights=nights)
    return result


@app.tool(effect="read", timeout=SEARCH_TIMEOUT, retry=READ_RETRY)
async def get_availability(
    ctx: ToolContext, hotel_id: str, check_in: str, nights: int = 1
) -> dict[str, Any]:
    """Whether a hotel has a room for the stay, and its total price."""
    result: dict[str, Any] = await _get(
        ctx, f"/hotels/{hotel_id}/availability", check_in=check_in, nights=nights
    )
    return result


# --- bookings ------------------------------------------------------------------------------


async def booking_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    return await _status_by_key(ctx, f"/bookings/by-key/{ctx.idempotency_key}")


async def cancel_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    return await _status_by_key(ctx, f"/idempotency/bookings.cancel/{ctx.idempotency_key}")


@app.tool(
    effect="write", timeout=BOOKING_TIMEOUT, idempotency="provider", status_check=cancel_status
)
async def cancel_booking(ctx: ToolContext, booking_id: str) -> dict[str, Any]:
    """Cancel a booking and release its room."""
    result: dict[str, Any] = await _post(ctx, f"/bookings/{booking_id}/cancel")
    return result


@app.tool(
    effect="write",
    timeout=BOOKING_TIMEOUT,
    idempotency="provider",
    status_check=booking_status,
    approval="guest",
    compensation=Compensation(
        "cancel_booking", arguments=lambda args, result: {"booking_id": result["booking_id"]}
    ),
)
async def create_booking(
    ctx: ToolContext, hotel_id: str, guest_id: str, check_in: str, nights: int = 1
) -> dict[str, Any]:
    """Hold a room for the guest's stay (the guest approves first)."""
    result: dict[str, Any] = await _post(
        ctx,
        "/bookings",
        {"hotel_id": hotel_id, "guest_id": guest_id, "check_in": check_in, "nights": nights},
    )
    return result


# --- payments ------------------------------------------------------------------------------


async def price_of_booking(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The server-computed amount: the booking's total, from the booking provider."""
    booking = await _get(ctx, f"/bookings/{args['booking_id']}")
    total: dict[str, Any] = booking["total"]
    return total


async def payment_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    return await _status_by_key(ctx, f"/payments/by-key/{ctx.idempotency_key}")


async def refund_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    return await _status_by_key(ctx, f"/idempotency/payments.refund/{ctx.idempotency_key}")


@app.tool(
    effect="money", timeout=BOOKING_TIMEOUT, idempotency="provider", status_check=refund_status
)
async def refund_payment(ctx: ToolContext, payment_id: str) -> dict[str, Any]:
    """Refund a payment in full."""
    result: dict[str, Any] = await _post(
        ctx, f"/payments/{payment_id}/refund", {"reason": "compensation"}
    )
    return result


@app.tool(
    effect="money",
    timeout=PAYMENT_TIMEOUT,
    idempotency="provider",
    status_check=payment_status,
    server_args={"amount": price_of_booking},
    approval="guest",  # the guest approves the server-computed amount
    compensation=Compensation(
        "refund_payment", arguments=lambda args, result: {"payment_id": result["payment_id"]}
    ),
)
async def create_payment(
    ctx: ToolContext, booking_id: str, guest_id: str, amount: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Charge the guest for a booking (the guest approves the amount, computed by the
    server, first)."""
    result: dict[str, Any] = await _post(
        ctx, "/payments", {"booking_id": booking_id, "guest_id": guest_id, "amount": amount}
    )
    return result


# --- notifications (outbox) ----------------------------------------------------------------


async def verified_address(ctx: ToolContext, args: dict[str, Any]) -> str:
    """The server-computed recipient: the guest's verified address."""
    guest = await _get(ctx, f"/guests/{args['guest_id']}")
    email: str = guest["email"]
    return email


@app.tool(
    effect="notify",
    timeout=NOTIFY_TIMEOUT,
    delivery="outbox",
    outbox_attempts=5,
    idempotency="provider",
    outbox_key=lambda args, ctx: f"crm:{args['guest_id']}:{args.get('booking_id')}",
)
async def crm_upsert(
    ctx: ToolContext,
    guest_id: str,
    booking_id: str | None = None,
    fields: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Create or update the guest's CRM contact (delivered asynchronously)."""
    try:
        result: dict[str, Any] = await _post(
            ctx,
            "/crm/contacts",
            {"guest_id": guest_id, "booking_id": booking_id, "fields": fields or {}},
        )
    except BusinessError as exc:
        data = exc.data if isinstance(exc.data, dict) else {}
        if data.get("error") != "contact_exists":
            raise
        # A CRM that dedupes by email (HubSpot's 409): update the contact it names. The
        # update merges the same fields, so sending it twice changes nothing.
        result = await _post(
            ctx,
            f"/crm/contacts/{data['contact_id']}",
            {"booking_id": booking_id, "fields": fields or {}},
            method="PATCH",
            key_suffix=":update",
        )
    return result


async def email_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    return await _status_by_key(ctx, f"/idempotency/email/{ctx.idempotency_key}")


@app.tool(
    effect="notify",
    timeout=NOTIFY_TIMEOUT,
    delivery="outbox",
    outbox_attempts=5,
    idempotency="effects",  # a mail service may have no idempotency key: claim it here
    status_check=email_status,
    server_args={"to": verified_address},
    # One email per booking and template; an email about no booking (a rejected request),
    # one per run and template (outbox keys are global).
    outbox_key=lambda args, ctx: f"email:{args.get('booking_id') or ctx.run_id}:{args['template']}",
)
async def send_email(
    ctx: ToolContext,
    guest_id: str,
    booking_id: str | None,
    subject: str,
    body: str,
    template: str = "confirmation",
    to: str = "",
) -> dict[str, Any]:
    """Email the guest (to their verified address; delivered asynchronously)."""
    result: dict[str, Any] = await _post(
        ctx, "/emails", {"to": to, "subject": subject, "body": body, "booking_id": booking_id}
    )
    return result


class BookingRequest(BaseModel):
    """A booking run's input (checked at submit)."""

    guest_id: str = Field(description="The guest, e.g. g-1")
    city: str = Field(description="Where to stay, e.g. Lisbon")
    check_in: str = Field(description="Arrival day, YYYY-MM-DD")
    nights: int = Field(1, ge=1, le=30)
    script: str = Field(
        "normal",
        description="The scripted model's behaviour: normal, guest_cancels, inject_amount, "
        "loop, loop_after_payment",
    )
    message: str | None = None
    company_id: str | None = Field(
        None, description="A corporate booking: the company's manager approves it first"
    )


def booking_policy(call: ProposedCall) -> Decision:
    """A corporate booking needs a manager's approval (rejected if nobody decides in
    time); everything else goes ahead, behind the tools' own guest approvals."""
    corporate = isinstance(call.run_input, dict) and bool(call.run_input.get("company_id"))
    if corporate and call.tool == "create_booking":
        return RequireApproval(
            role="manager", expires_in=MANAGER_APPROVAL_SECONDS, default="reject"
        )
    return Allow()


TOOLS = [
    search_hotels,
    get_availability,
    create_booking,
    cancel_booking,
    create_payment,
    refund_payment,
    crm_upsert,
    send_email,
]

INSTRUCTIONS = (
    "You are StayHub's booking assistant. Find a hotel in the guest's city, check "
    "availability, book it (the guest approves), take the payment, update the CRM and "
    "email the confirmation. Never invent prices or addresses."
)

agent = app.add_agent(
    Agent(
        name="stayhub_booking",
        version="1",
        model=ScriptedModel(booking_script, name="stayhub-scripted"),
        instructions=INSTRUCTIONS,
        tools=TOOLS,
        budget=Budget(max_steps=20, active_seconds=120.0),
        end_user_message="We could not finish your booking automatically; our team will follow up.",
        input_model=BookingRequest,
        policy=booking_policy,
    )
)

# The help agent (policy answers from documents, guest memory): knowledge.py.
from agentledger_examples.stayhub.knowledge import register_knowledge  # noqa: E402

register_knowledge(app)
