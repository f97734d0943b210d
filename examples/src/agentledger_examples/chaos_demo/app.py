"""The checkout ``agentledger chaos`` runs in the README.

A workflow charges an order at the payments provider (``provider.py``; its address in
``CHECKOUT_PAYMENTS_URL``, or the chaos proxy's in ``AGENTLEDGER_CHAOS_PROXY_PAY``) with
the step's idempotency key, then files a receipt in a local file that dedupes by the
step's key, with a status check that looks for the key; the file is no HTTP provider, so
the tool counts its effects with ``chaos_effect``.

``agentledger soak`` runs a mix of it: the ``order`` workflow (a large order charged
once a manager approved, a receipt, a confirmation mailed through the outbox to a local
file deduped by key; an amount the provider refuses fails the run) and the ``clerk``
agent, whose scripted model calls ``charge``.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx

from agentledger import (
    Agent,
    App,
    BusinessError,
    ScriptedModel,
    Status,
    ToolContext,
    Turn,
    WorkflowContext,
)
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


async def _charge(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
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


@app.tool(effect="money", timeout=2, idempotency="provider", status_check=charge_status)
async def charge(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
    """Charge an order (amount in cents), once per step whatever is retried."""
    return await _charge(ctx, order_id, amount)


@app.tool(
    effect="money",
    timeout=2,
    idempotency="provider",
    status_check=charge_status,
    approval="manager",
)
async def charge_large(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
    """Charge a large order, once a manager approved it."""
    return await _charge(ctx, order_id, amount)


def receipts() -> Path:
    """The receipts file (shared by every worker on the host)."""
    default = Path(tempfile.gettempdir()) / "agentledger-checkout-receipts.txt"
    return Path(os.environ.get("CHECKOUT_RECEIPTS", default))


# Per file: how far this process has read it and the keys it found there. The files only
# grow, so each look reads just the lines added since the last one: a soak's hour of
# receipts is not read again on every call.
_read: dict[Path, tuple[int, set[str]]] = {}


def _filed(path: Path, key: str) -> bool:
    """Whether a line of ``path`` ends with ``key`` (complete lines only)."""
    offset, keys = _read.get(path, (0, set()))
    try:
        with path.open("rb") as f:
            if f.seek(0, os.SEEK_END) < offset:  # a new file under the old name
                offset, keys = 0, set()
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        _read.pop(path, None)
        return False
    complete = chunk[: chunk.rfind(b"\n") + 1]
    keys.update(line.rsplit(" ", 1)[-1] for line in complete.decode().splitlines())
    _read[path] = (offset + len(complete), keys)
    return key in keys


async def receipt_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    """Whether the receipt of this step is in the file (its key ends the line)."""
    if _filed(receipts(), ctx.idempotency_key):
        return Status.succeeded({"filed": args["order_id"]})
    return Status.not_found()


def _append_once(path: Path, key: str, line: str, provider: str) -> None:
    """Append ``line`` and the key to ``path`` unless the key is there already (under a
    lock: a worker frozen past its lease may send its call after another worker filed it).
    The hook counts each line."""
    with path.open("a") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        if _filed(path, key):
            return
        out.write(f"{line} {key}\n")
        out.flush()
        chaos_effect(key, provider=provider)


@app.tool(effect="write", timeout=2, idempotency="provider", status_check=receipt_status)
async def file_receipt(ctx: ToolContext, order_id: str, charge_id: str) -> dict[str, Any]:
    """Append a receipt line to a local file, once per key: the line ends with the step's
    key, and a key already filed is not filed again."""
    _append_once(receipts(), ctx.idempotency_key, f"{order_id} {charge_id}", "receipts")
    return {"filed": order_id}


def confirmations() -> Path:
    """The sent confirmations (a mail provider's outbox, shared by every worker)."""
    default = Path(tempfile.gettempdir()) / "agentledger-checkout-confirmations.txt"
    return Path(os.environ.get("CHECKOUT_CONFIRMATIONS", default))


@app.tool(
    effect="notify",
    timeout=2,
    delivery="outbox",
    idempotency="provider",
    outbox_key=lambda args, ctx: f"confirm:{ctx.idempotency_key}",
)
async def send_confirmation(ctx: ToolContext, order_id: str, charge_id: str) -> dict[str, Any]:
    """Mail the order's confirmation, once per key, after the run moved on (the outbox)."""
    _append_once(confirmations(), ctx.idempotency_key, f"{order_id} {charge_id}", "mail")
    return {"sent": order_id}


@app.workflow(name="checkout", version="1")
async def checkout(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    """Charge the order, then file its receipt."""
    paid = await ctx.tool("charge", order_id=order["order_id"], amount=order["amount"])
    await ctx.tool("file_receipt", order_id=order["order_id"], charge_id=paid["id"])
    return {"order_id": order["order_id"], "charge": paid["id"]}


LARGE = 50_000
"""Orders from this amount (cents) are charged once a manager approved."""


@app.workflow(name="order", version="1")
async def order(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    """The soak's order: charge (a large one after an approval), file the receipt, and
    mail the confirmation through the outbox. An amount the provider refuses fails the run."""
    tool = "charge_large" if order["amount"] >= LARGE else "charge"
    paid = await ctx.tool(tool, order_id=order["order_id"], amount=order["amount"])
    await ctx.tool("file_receipt", order_id=order["order_id"], charge_id=paid["id"])
    await ctx.tool("send_confirmation", order_id=order["order_id"], charge_id=paid["id"])
    return {"order_id": order["order_id"], "charge": paid["id"]}


app.add_agent(
    Agent(
        name="clerk",
        version="1",
        model=ScriptedModel(
            [
                Turn(calls=[("charge", {"order_id": "desk", "amount": 700})]),
                Turn(text="The desk order is charged."),
            ]
        ),
        instructions="Charge the desk order.",
        tools=[charge],
    )
)
