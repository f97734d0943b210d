"""The App the service tests submit runs of (and their inline workers run)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pydantic import BaseModel

from agentledger import Allow, App, RequireApproval, ToolContext, WorkflowContext
from agentledger._budget import Budget
from agentledger._policies import ProposedCall
from agentledger.tools._contract import Compensation
from agentledger.tools._status import Status

app = App("service-tests")


class EchoInput(BaseModel):
    """The declared input of ``echo``."""

    text: str
    steps: int = 0
    pause: float = 0.0


async def _pause(seconds: float, flag: str | None) -> str:
    """Sleep; while ``flag`` (a file) exists, hold here (bounded)."""
    await asyncio.sleep(seconds)
    until = time.monotonic() + 60
    while flag and os.path.exists(flag) and time.monotonic() < until:
        await asyncio.sleep(0.01)
    return "ok"


@app.workflow(name="echo", version="1")
async def echo(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """``steps`` journaled steps of ``pause`` seconds, then the text back."""
    for i in range(int(input.get("steps", 0))):
        await ctx.step(f"pause_{i}", _pause, float(input.get("pause", 0)), input.get("flag"))
    return {"text": input["text"]}


echo.input_model = EchoInput  # type: ignore[attr-defined]


@app.workflow(name="free", version="1")
async def free(ctx: WorkflowContext, input: Any) -> Any:
    """Any input, returned as it is."""
    return input


@app.tool(effect="write", idempotency="effects")
async def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """A payment (guarded by the effects table: at most once per key)."""
    return {"paid": amount, "key": ctx.idempotency_key}


def approval_policy(call: ProposedCall) -> Any:
    """``input["approval"] = {"role": R, "expires_in": S, "not_requester": B}`` puts
    ``pay`` behind approval."""
    spec = call.run_input.get("approval") if isinstance(call.run_input, dict) else None
    if spec and call.tool == "pay":
        return RequireApproval(
            role=spec["role"],
            expires_in=float(spec.get("expires_in", 3600)),
            not_requester=bool(spec.get("not_requester", False)),
        )
    return Allow()


@app.workflow(name="payout", version="1", policy=approval_policy)
async def payout(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """One payment, behind an approval when the input asks for one."""
    return await ctx.tool("pay", amount=int(input["amount"]))


@app.tool(effect="write", idempotency="effects")
async def refund(ctx: ToolContext, charge: str) -> dict[str, Any]:
    """Undo a ``charge``."""
    return {"refunded": charge}


@app.tool(
    effect="write",
    idempotency="effects",
    compensation=Compensation("refund", lambda args, result: {"charge": result["charge"]}),
)
async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """A charge, undone by ``refund`` when the run is cancelled later."""
    return {"charge": f"ch_{amount}"}


@app.workflow(name="charge_then_wait", version="1")
async def charge_then_wait(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """Charge, then wait an hour (the run parks), then one more step."""
    await ctx.tool("charge", amount=int(input.get("amount", 10)))
    await ctx.sleep(3600)
    await ctx.step("after", _pause, 0.0, None)
    return {"done": True}


@app.workflow(name="over_budget", version="1", budget=Budget(max_steps=1))
async def over_budget(ctx: WorkflowContext, input: Any) -> Any:
    """Two steps on a one-step budget: handed to a human (``needs_human``)."""
    await ctx.step("first", _pause, 0.0, None)
    await ctx.step("second", _pause, 0.0, None)
    return "unreachable"


async def ship_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    """The carrier's answer about a shipment's key: shipped, with what it was sent."""
    return Status.succeeded({"shipped": args.get("parcel"), "key": ctx.idempotency_key})


@app.tool(effect="write", idempotency="provider", status_check=ship_status)
async def ship(ctx: ToolContext, parcel: str) -> dict[str, Any]:
    """Ship a parcel (the carrier answers status queries about its key)."""
    return {"shipped": parcel}
