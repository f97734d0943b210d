"""Two executions of one step in one process (the run re-claimed while its first
execution is still inside the call): the first one's success is not held while the
second waits to re-read the journal; the fence refuses it, the second settles the step
by its status check, and the provider is called once."""

from __future__ import annotations

import asyncio
from typing import Any

from agentledger.engine._signals import Abandon
from agentledger.engine._tool_step import run_tool_step
from agentledger.records import StepStatus
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import tool
from tests.fast.writes_harness import Provider, World, world

__all__ = ["world"]


async def test_a_contended_step_is_called_once_and_settled_by_the_new_owner(world: World) -> None:
    provider, release = Provider(), asyncio.Event()

    async def pay(ctx: ToolContext, item: str = "x") -> Any:
        result = await provider.call(ctx, {"item": item})
        await release.wait()
        return result

    world.add(
        tool(pay, name="pay", effect="write", idempotency="provider", status_check=provider.status)
    )
    first = await world.new_execution()
    calling = asyncio.create_task(run_tool_step(first, 1, "pay", {"item": "a"}))
    while not provider.calls:
        await asyncio.sleep(0.01)
    second = await world.reclaim(first.run.id)
    assert second.journal[1].status == StepStatus.STARTED
    settling = asyncio.create_task(run_tool_step(second, 1, "pay", {"item": "a"}))
    await asyncio.sleep(0.05)  # the second execution waits for the first to leave
    release.set()
    try:
        await calling
        raise AssertionError("the first execution's outcome was accepted")
    except Abandon:
        pass
    outcome = await settling
    assert outcome.ok and outcome.result == provider.applied[provider.calls[0]]
    step = await world.step(first.run.id, 1)
    assert (step.status, step.lease_epoch) == (StepStatus.SUCCEEDED, second.epoch)
    assert len(provider.calls) == 1 and provider.checks == 1
    await second.settle_held()
    step = await world.step(first.run.id, 1)
    assert step.status == StepStatus.SUCCEEDED
