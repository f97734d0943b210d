"""The checkout ``agentledger chaos`` runs in the README.

A workflow charges an order at the payments provider (``provider.py``; its address in
``CHECKOUT_PAYMENTS_URL``, or the chaos proxy's in ``AGENTLEDGER_CHAOS_PROXY_PAY``) with
the step's idempotency key, then files a receipt in a local file that dedupes by the
step's key, with a status check that looks for the key; the file is no HTTP provider, so
the tool counts its effects with ``chaos_effect``.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx

from agentledger import App, BusinessError, Status, ToolContext, WorkflowContext
from agentledger.testing import chaos_effect
from agentledger.tools import call_provider

app = App("checkout")


def payments_url() -> str:
    """Where the payments provider is: the chaos proxy under ``agentledger chaos``."""
    return os.environ.get(
        "AGENTLEDGER_CHAOS_PROXY_PAY",
        os.environ.get("CHECKOUT_PAYMENTS_URL", "http://127.0.0.1:8765"),
    )


async def charge_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    """Look the charge up by its key: succeeded with the charge, or not found."""
    async with httpx.AsyncClient(timeout=ctx.time_left()) as client:
        try:
            response = await call_provider(
                client, "GET", f"{payments_url()}/charges/{ctx.idempotency_key}"
            )
        except BusinessError as exc:
            if isinstance(exc.data, dict) and exc.data.get("error") == "not_found":
                return Status.not_found()
            raise
    return Status.succeeded(response.json())


@app.tool(effect="money", timeout=2, idempotency="provider", status_check=charge_status)
async def charge(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
    """Charge an order (amount in cents), once per step whatever is retried."""
    async with httpx.AsyncClient(timeout=ctx.time_left()) as client:
        response = await call_provider(
            client,
            "POST",
            f"{payments_url()}/charges",
            json={"order_id": order_id, "amount": amount},
            headers={"Idempotency-Key": ctx.idempotency_key},
        )
    result: dict[str, Any] = response.json()
    return result


def receipts() -> Path:
    """The receipts file (shared by every worker on the host)."""
    default = Path(tempfile.gettempdir()) / "agentledger-checkout-receipts.txt"
    return Path(os.environ.get("CHECKOUT_RECEIPTS", default))


def _filed(path: Path, key: str) -> bool:
    lines = path.read_text().splitlines() if path.exists() else []
    return any(line.endswith(f" {key}") for line in lines)


async def receipt_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    """Whether the receipt of this step is in the file (its key ends the line)."""
    if _filed(receipts(), ctx.idempotency_key):
        return Status.succeeded({"filed": args["order_id"]})
    return Status.not_found()


@app.tool(effect="write", timeout=2, idempotency="provider", status_check=receipt_status)
async def file_receipt(ctx: ToolContext, order_id: str, charge_id: str) -> dict[str, Any]:
    """Append a receipt line to a local file, once per key: the line ends with the step's
    key, and a key already filed is not filed again (under a lock: a worker frozen past its
    lease may send its call after another worker filed it). The hook counts each line."""
    path = receipts()
    with path.open("a") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        if _filed(path, ctx.idempotency_key):
            return {"filed": order_id}
        out.write(f"{order_id} {charge_id} {ctx.idempotency_key}\n")
        out.flush()
        chaos_effect(ctx.idempotency_key, provider="receipts")
    return {"filed": order_id}


@app.workflow(name="checkout", version="1")
async def checkout(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    """Charge the order, then file its receipt."""
    paid = await ctx.tool("charge", order_id=order["order_id"], amount=order["amount"])
    await ctx.tool("file_receipt", order_id=order["order_id"], charge_id=paid["id"])
    return {"order_id": order["order_id"], "charge": paid["id"]}
