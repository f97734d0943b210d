"""A cancel requested while a write's outcome is held, then a write that needs an
approval: the approval is not requested for a run already cancelled.

Without a held outcome the write's own commit reads the cancel back and the run stops
at the next boundary; with one, the next write's entry carries it, and a call that
needs an approval would otherwise ask a person to approve a call of a cancelled run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentledger.engine._signals import Cancelled
from agentledger.engine._tool_step import run_tool_step
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import tool
from tests.fast.writes_harness import Provider, World, world

__all__ = ["world"]


async def test_no_approval_is_requested_for_a_run_cancelled_while_an_outcome_was_held(
    world: World,
) -> None:
    pay, refund, release = Provider(), Provider(), asyncio.Event()

    async def charge(ctx: ToolContext, item: str = "x") -> Any:
        result = await pay.call(ctx, {"item": item})
        await release.wait()
        return result

    async def big_refund(ctx: ToolContext, item: str = "x") -> Any:
        return await refund.call(ctx, {"item": item})

    world.add(
        tool(charge, name="pay", effect="write", idempotency="provider", status_check=pay.status),
        tool(
            big_refund,
            name="big_refund",
            effect="write",
            idempotency="provider",
            status_check=refund.status,
            approval="manager",
        ),
    )
    exe = await world.new_execution()
    calling = asyncio.create_task(run_tool_step(exe, 1, "pay", {"item": "a"}))
    while not pay.calls:
        await asyncio.sleep(0.01)
    # Requested while the first write is being called: its outcome, held, reads it back.
    await world.store.cancel_run(exe.run.id, "changed my mind", "user:ann")
    release.set()
    assert (await calling).ok
    await exe.before_step(carries=True)  # what ctx.tool does before a plain write
    with pytest.raises(Cancelled):
        await run_tool_step(exe, 2, "big_refund", {"item": "r"})
    assert await world.store.get_approvals(exe.run.id) == []
    assert refund.calls == []
    assert (await world.step(exe.run.id, 1)).status == "succeeded"
