"""The app of the backup and restore tests: a booking and a charge at the StayHub sandbox
(``SANDBOX_URL``), a gate the test holds a run at while it takes a backup, and a key-less
write guarded by the effects table (the engine tests' ledger).

Every request that may charge is counted in the engine tests' ledger
(:func:`tests.apps.ledger.record_call`, kind ``charge_post``) before it is sent, so a test
sees a second ``POST /payments`` even though the sandbox would answer it from its
idempotency store with the first charge.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from agentledger import App, ToolContext, WorkflowContext
from agentledger.errors import BusinessError
from agentledger.tools._status import Status
from tests.apps import ledger
from tests.apps.engine_app import guarded_write, hold, hold_spec

app = App("restore-tests")
app.add_tool(guarded_write)

GUEST = "g-123"
HOTEL = "h-lis-1"


def _url() -> str:
    return os.environ["SANDBOX_URL"]


async def _post(ctx: ToolContext, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=_url(), timeout=10) as client:
        response = await client.post(
            path, json=body, headers={"Idempotency-Key": ctx.idempotency_key}
        )
    if response.status_code >= 400:
        raise BusinessError(f"{path}: {response.status_code} {response.text}")
    result: dict[str, Any] = response.json()
    return result


async def _status(ctx: ToolContext, path: str) -> Status:
    async with httpx.AsyncClient(base_url=_url(), timeout=10) as client:
        response = await client.get(path)
    if response.status_code == 404:
        return Status.not_found()
    body = response.json()
    if response.status_code == 200 and body.get("status") == "succeeded":
        return Status.succeeded(body.get("response"))
    return Status.pending()


async def booking_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    return await _status(ctx, f"/bookings/by-key/{ctx.idempotency_key}")


async def payment_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    return await _status(ctx, f"/payments/by-key/{ctx.idempotency_key}")


@app.tool(effect="write", timeout=10, idempotency="provider", status_check=booking_status)
async def book(ctx: ToolContext, check_in: str) -> dict[str, Any]:
    """Hold a room at the sandbox."""
    body = {"hotel_id": HOTEL, "guest_id": GUEST, "check_in": check_in, "nights": 1}
    return await _post(ctx, "/bookings", body)


@app.tool(effect="money", timeout=10, idempotency="provider", status_check=payment_status)
async def charge(ctx: ToolContext, booking_id: str, amount: int) -> dict[str, Any]:
    """Charge the guest at the sandbox (each request counted before it is sent)."""
    ledger.record_call(ctx.idempotency_key, "charge_post")
    body = {"booking_id": booking_id, "guest_id": GUEST, "amount": {"amount": amount,
            "currency": "EUR"}}  # fmt: skip
    return await _post(ctx, "/payments", body)


@app.workflow(name="restore_flow", version="1")
async def restore_flow(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """Book, pass the gate (held while ``input["hold"]`` names a flag file that exists),
    then charge, or make the key-less write when ``input["keyless"]``."""
    booking = await ctx.tool("book", check_in=str(input["check_in"]))

    async def gate() -> str:
        spec = hold_spec(input, "gate", "before")
        if spec:
            await hold(*spec)
        return "passed"

    await ctx.step("gate", gate)
    if input.get("keyless"):
        done = await ctx.tool("guarded_write", item="gift")
        return {"gift": done}
    paid = await ctx.tool("charge", booking_id=booking["booking_id"], amount=booking_total(booking))
    return {"payment": paid}


def booking_total(booking: dict[str, Any]) -> int:
    total = booking.get("total")
    return int(total["amount"]) if isinstance(total, dict) else 0
