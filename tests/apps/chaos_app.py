"""An app for ``agentledger chaos``'s own tests: one correct checkout and two broken ones.

Every tool charges the payments provider of the chaos example
(``agentledger_examples.chaos_demo.provider``) through the chaos proxy named ``pay``
(``AGENTLEDGER_CHAOS_PROXY_PAY``), which the test starts in front of it.

- ``checkout``: correct. The charge carries the step's key to a provider that honours
  it, with an honest status check; the receipt is a key-less local write guarded by the
  effects table and counted with ``chaos_effect``.
- ``checkout_trusting``: broken. The charge declares ``idempotency="provider"`` but its
  provider ignores keys (the test starts it with ``ignore_keys``): a same-key resend after
  an unknown outcome charges again.
- ``naps``: twelve short steps, for freezes to land in.
- ``tallies``: eight writes counted with the hook at every call.
- ``frugal``: an agent whose token budget its first model step uses up.
- ``checkout_lying``: broken. The charge's status check answers ``not_found`` even after
  the provider charged: the runtime sends it again, and the provider charges again.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx

from agentledger import (
    Agent,
    App,
    Budget,
    BusinessError,
    ScriptedModel,
    Status,
    ToolContext,
    Turn,
    WorkflowContext,
)
from agentledger.testing import chaos_effect
from agentledger.tools import call_provider

app = App("chaos_tests")


def _url() -> str:
    return os.environ["AGENTLEDGER_CHAOS_PROXY_PAY"]


async def _charge(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=ctx.time_left()) as client:
        response = await call_provider(
            client,
            "POST",
            f"{_url()}/charges",
            json={"order_id": order_id, "amount": amount},
            headers={"Idempotency-Key": ctx.idempotency_key},
        )
    result: dict[str, Any] = response.json()
    return result


async def honest_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    """The charge made with this step's key, or not found."""
    async with httpx.AsyncClient(timeout=ctx.time_left()) as client:
        try:
            response = await call_provider(client, "GET", f"{_url()}/charges/{ctx.idempotency_key}")
        except BusinessError:
            return Status.not_found()
    return Status.succeeded(response.json())


async def lying_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    """Asks the provider, then says not found whatever it answered."""
    await honest_status(ctx, args)
    return Status.not_found()


@app.tool(effect="money", timeout=2, idempotency="provider", status_check=honest_status)
async def charge(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
    """Charge an order once per step."""
    return await _charge(ctx, order_id, amount)


@app.tool(effect="money", timeout=2, idempotency="provider")
async def charge_trusting(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
    """Declares that the provider dedupes keys; the provider it talks to does not."""
    return await _charge(ctx, order_id, amount)


@app.tool(effect="money", timeout=2, status_check=lying_status)
async def charge_lying(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
    """A key-less provider's charge whose status check lies."""
    return await _charge(ctx, order_id, amount)


@app.tool(effect="write", timeout=2)
async def file_receipt(ctx: ToolContext, order_id: str, charge_id: str) -> dict[str, Any]:
    """A key-less local write, counted with the hook."""
    with Path(os.environ["CHAOS_TEST_RECEIPTS"]).open("a") as out:
        out.write(f"{order_id} {charge_id}\n")
    chaos_effect(ctx.idempotency_key, provider="receipts")
    return {"filed": order_id}


async def _checkout(ctx: WorkflowContext, order: dict[str, Any], tool: str) -> dict[str, Any]:
    paid = await ctx.tool(tool, order_id=order["order_id"], amount=order["amount"])
    # Packing takes a moment: long enough for a kill or a freeze to land between the writes.
    await ctx.step("pack", asyncio.sleep, 1.0)
    await ctx.tool("file_receipt", order_id=order["order_id"], charge_id=paid["id"])
    return {"charge": paid["id"]}


@app.workflow(name="checkout", version="1")
async def checkout(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    return await _checkout(ctx, order, "charge")


@app.workflow(name="checkout_trusting", version="1")
async def checkout_trusting(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    return await _checkout(ctx, order, "charge_trusting")


@app.workflow(name="checkout_lying", version="1")
async def checkout_lying(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    return await _checkout(ctx, order, "charge_lying")


@app.workflow(name="naps", version="1")
async def naps(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    """Twelve short steps: a worker frozen past its lease is frozen inside one."""
    for n in range(12):
        await ctx.step(f"nap{n}", asyncio.sleep, 0.3)
    return {"order_id": order["order_id"]}


@app.tool(effect="write", timeout=2, idempotency="provider")
async def tally(ctx: ToolContext, n: int) -> int:
    """Counts every call it gets with the hook. Sent again with its key only after an
    unknown outcome, never once its step is journaled succeeded."""
    await asyncio.sleep(0.3)
    chaos_effect(ctx.idempotency_key, provider="tally")
    return n


@app.workflow(name="tallies", version="1")
async def tallies(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    """Eight tallies, one after the other."""
    for n in range(8):
        await ctx.tool("tally", n=n)
    return {"order_id": order["order_id"]}


@app.tool(effect="read", timeout=2)
async def look_up(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """An order's state (a read: nothing to count)."""
    return {"order_id": order_id, "state": "paid"}


app.add_agent(
    Agent(
        name="frugal",
        version="1",
        model=ScriptedModel(
            [Turn(calls=[("look_up", {"order_id": f"o-{n}"})]) for n in range(6)]
            + [Turn(text="All six orders are paid.")]
        ),
        instructions="Check each order.",
        tools=[look_up],
        # Used up by the first model step: the runtime hands the run over before the next.
        budget=Budget(max_tokens=50),
    )
)
