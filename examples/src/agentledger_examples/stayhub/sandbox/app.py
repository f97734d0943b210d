"""The StayHub sandbox HTTP app: routes for search, bookings, payments, CRM, email, ledger.

Every write needs an ``Idempotency-Key`` header. Status checks by key
(``GET /bookings/by-key/{key}``, ``GET /payments/by-key/{key}``, and for any write endpoint
``GET /idempotency/{endpoint}/{key}``) answer ``{"status": "succeeded" | "failed",
"status_code", "response"}`` (``failed`` = a stored business error such as ``sold_out``),
``{"status": "pending"}`` while the first request is in flight, or 404
``{"status": "not_found"}``; a ``keyless`` endpoint answers 400
``idempotency_not_supported``. Writes record the ``X-Run-Id`` header in the ledger.

``GET /faults`` returns the installed configuration plus ``stats``: how often each fault
fired and how many committed answers each endpoint dropped (lost or replaced by a 5xx).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from typing import Annotated, Any

from fastapi import Body, FastAPI, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.responses import Response

from agentledger_examples.stayhub.sandbox import catalog, providers
from agentledger_examples.stayhub.sandbox.db import Database
from agentledger_examples.stayhub.sandbox.faults import (
    WRITE_ENDPOINTS,
    FaultConfig,
    FaultInjector,
    config_from_dict,
)
from agentledger_examples.stayhub.sandbox.idempotency import (
    DEFAULT_KEY_TTL,
    abandon_all_in_progress,
)
from agentledger_examples.stayhub.sandbox.ledger import list_effects
from agentledger_examples.stayhub.sandbox.pipeline import Pipeline, json_response
from agentledger_examples.stayhub.sandbox.providers import Outcome

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]
Nights = Annotated[int, Query(ge=1, le=30)]


class Money(BaseModel):
    """Integer minor units (cents) and an ISO 4217 currency code."""

    amount: int = Field(ge=0)
    currency: str = Field(min_length=3, max_length=3)


class BookingRequest(BaseModel):
    """``POST /bookings``."""

    hotel_id: str
    guest_id: str
    check_in: date
    nights: int = Field(ge=1, le=30)


class PaymentRequest(BaseModel):
    """``POST /payments``."""

    booking_id: str
    amount: Money
    guest_id: str


class RefundRequest(BaseModel):
    """``POST /payments/{payment_id}/refund`` (the body is optional)."""

    reason: str | None = None


class ContactRequest(BaseModel):
    """``POST /crm/contacts``."""

    guest_id: str
    booking_id: str | None = None
    fields: dict[str, Any] = Field(default_factory=dict)


class ContactUpdate(BaseModel):
    """``PATCH /crm/contacts/{contact_id}``."""

    booking_id: str | None = None
    fields: dict[str, Any] = Field(default_factory=dict)


class EmailRequest(BaseModel):
    """``POST /emails``."""

    to: str
    subject: str
    body: str
    booking_id: str | None = None


def create_app(
    ledger_path: str | None = None,
    faults: FaultConfig | None = None,
    key_ttl: float = DEFAULT_KEY_TTL,
) -> FastAPI:
    """Build the sandbox app on the SQLite file ``ledger_path`` (a temp file if ``None``).

    Idempotency keys are pruned ``key_ttl`` seconds after their first use (24 h default).

    In-progress idempotency records left by a previous (killed) process are dropped: nothing
    was applied for them, so their status is ``not_found`` and a retry applies them once.
    """
    db = Database(ledger_path)
    with db.transaction() as conn:
        abandon_all_in_progress(conn)
    pipe = Pipeline(db, FaultInjector(faults), key_ttl)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await pipe.aclose()
        db.close()

    app = FastAPI(title="StayHub sandbox", lifespan=lifespan)
    app.state.db = db
    app.state.pipeline = pipe

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        detail = jsonable_encoder(exc.errors(), exclude={"ctx", "url", "input"})
        return json_response(422, {"error": "invalid_request", "detail": detail})

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response(200, {"ok": True, "ledger": db.path})

    # --- reads -------------------------------------------------------------------------------
    @app.get("/hotels")
    async def search(city: str, nights: Nights = 1) -> Response:
        def op(_: Any) -> Outcome:
            hotels = [
                {**h.to_json(), "total": catalog.money(h.price_per_night * nights)}
                for h in catalog.hotels_in(city)
            ]
            return Outcome(200, {"city": city, "nights": nights, "hotels": hotels})

        return await pipe.read("search", op)

    @app.get("/hotels/{hotel_id}/availability")
    async def availability(hotel_id: str, check_in: date, nights: Nights = 1) -> Response:
        return await pipe.read(
            "availability", lambda c: providers.availability(c, hotel_id, check_in, nights)
        )

    @app.get("/guests/{guest_id}")
    async def guest(guest_id: str) -> Response:
        def op(_: Any) -> Outcome:
            profile = catalog.guest(guest_id)
            return (
                Outcome(404, {"error": "guest_not_found"})
                if profile is None
                else Outcome(200, dict(profile))
            )

        return await pipe.read("guests", op)

    @app.get("/bookings/by-key/{key:path}")
    async def booking_status(key: str) -> Response:
        status = pipe.status_of("bookings.create", key, "bookings.status")
        return await pipe.read("bookings.status", status)

    @app.get("/bookings/{booking_id}")
    async def get_booking(booking_id: str) -> Response:
        return await pipe.read("bookings.status", lambda c: providers.get_booking(c, booking_id))

    @app.get("/payments/by-key/{key:path}")
    async def payment_status(key: str) -> Response:
        status = pipe.status_of("payments.create", key, "payments.status")
        return await pipe.read("payments.status", status)

    @app.get("/payments/{payment_id}")
    async def get_payment(payment_id: str) -> Response:
        return await pipe.read("payments.status", lambda c: providers.get_payment(c, payment_id))

    @app.get("/idempotency/{endpoint}/{key:path}")
    async def key_status(endpoint: str, key: str) -> Response:
        if endpoint not in WRITE_ENDPOINTS:
            return json_response(404, {"error": "unknown_endpoint"})
        return await pipe.read("status", pipe.status_of(endpoint, key, "status"))

    # --- writes ------------------------------------------------------------------------------
    @app.post("/bookings")
    async def create_booking(
        request: Request, req: BookingRequest, key: IdempotencyKey = None
    ) -> Response:
        return await pipe.write(
            "bookings.create",
            key,
            req.model_dump(mode="json"),
            lambda c: providers.create_booking(
                c, key or "", req.hotel_id, req.guest_id, req.check_in, req.nights
            ),
            request,
        )

    @app.post("/bookings/{booking_id}/cancel")
    async def cancel_booking(
        request: Request, booking_id: str, key: IdempotencyKey = None
    ) -> Response:
        return await pipe.write(
            "bookings.cancel",
            key,
            {"booking_id": booking_id},
            lambda c: providers.cancel_booking(c, key or "", booking_id),
            request,
        )

    @app.post("/payments")
    async def create_payment(
        request: Request, req: PaymentRequest, key: IdempotencyKey = None
    ) -> Response:
        def op(c: Any) -> Outcome:
            return providers.create_payment(
                c,
                key or "",
                req.booking_id,
                req.guest_id,
                req.amount.amount,
                req.amount.currency,
                declined=pipe.faults.declines("payments.create"),
            )

        return await pipe.write("payments.create", key, req.model_dump(mode="json"), op, request)

    @app.post("/payments/{payment_id}/refund")
    async def refund(
        request: Request,
        payment_id: str,
        key: IdempotencyKey = None,
        req: Annotated[RefundRequest | None, Body()] = None,
    ) -> Response:
        params = {"payment_id": payment_id, **(req.model_dump() if req else {"reason": None})}
        return await pipe.write(
            "payments.refund",
            key,
            params,
            lambda c: providers.refund_payment(c, key or "", payment_id),
            request,
        )

    @app.post("/crm/contacts")
    async def crm(request: Request, req: ContactRequest, key: IdempotencyKey = None) -> Response:
        def op(c: Any) -> Outcome:
            if pipe.faults.is_keyless("crm"):  # HubSpot: create, or 409 for a known email
                return providers.create_contact(
                    c, key or "", req.guest_id, req.booking_id, req.fields
                )
            return providers.upsert_contact(c, key or "", req.guest_id, req.booking_id, req.fields)

        return await pipe.write("crm", key, req.model_dump(mode="json"), op, request)

    @app.patch("/crm/contacts/{contact_id}")
    async def crm_update(
        request: Request, contact_id: str, req: ContactUpdate, key: IdempotencyKey = None
    ) -> Response:
        return await pipe.write(
            "crm.update",
            key,
            {"contact_id": contact_id, **req.model_dump(mode="json")},
            lambda c: providers.update_contact(
                c, key or "", contact_id, req.booking_id, req.fields
            ),
            request,
        )

    @app.post("/emails")
    async def email(request: Request, req: EmailRequest, key: IdempotencyKey = None) -> Response:
        return await pipe.write(
            "email",
            key,
            req.model_dump(mode="json"),
            lambda c: providers.send_email(
                c, key or "", req.to, req.subject, req.body, req.booking_id
            ),
            request,
        )

    # --- ledger and fault control ------------------------------------------------------------
    @app.get("/ledger")
    async def ledger() -> Response:
        with db.transaction() as conn:
            return json_response(200, {"effects": list_effects(conn)})

    @app.post("/ledger/reset")
    async def reset() -> Response:
        db.reset()
        return json_response(200, {"ok": True})

    @app.get("/faults")
    async def get_faults() -> Response:
        return json_response(200, {**pipe.faults.config.to_dict(), "stats": pipe.faults.stats()})

    @app.put("/faults")
    async def put_faults(body: Annotated[dict[str, Any], Body()]) -> Response:
        try:
            config = config_from_dict(body)
        except ValueError as exc:
            return json_response(422, {"error": "invalid_faults", "detail": str(exc)})
        pipe.faults.install(config)
        return json_response(200, config.to_dict())

    @app.delete("/faults")
    async def clear_faults() -> Response:
        pipe.faults.install(FaultConfig())
        return json_response(200, FaultConfig().to_dict())

    return app
