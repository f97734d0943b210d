"""A held outcome carried by a write the store refuses for a key another run holds
(an effect claim, an outbox key) is not lost with it: it is committed on its own.

In workflow code that runs calls concurrently, a step that claims an effect key may
journal its claim right after a sibling's outcome was held (the claim's own boundary
committed what was held before it, not what was held after).
"""

from __future__ import annotations

from agentledger.engine._steps import claim_effect, new_step
from agentledger.engine._tool_step import run_tool_step
from agentledger.records import StepStatus
from tests.fast.writes_harness import Provider, World, make_tool, world

__all__ = ["world"]


async def test_a_held_outcome_survives_the_refused_claim_that_carried_it(world: World) -> None:
    pay, gift = Provider(), Provider(keyed=False)
    world.add(make_tool(pay, "pay"), make_tool(gift, "gift", idempotency="effects", checked=False))
    other = await world.new_execution()
    assert (await run_tool_step(other, 1, "gift", {"item": "g"})).ok  # holds key "...:1"

    exe = await world.new_execution()
    assert (await run_tool_step(exe, 1, "pay", {"item": "a"})).ok  # its outcome is held
    assert exe._held is not None
    # A sibling's claim, in the same turn, of the key the other run holds.
    step = new_step(exe, 2, "tool", "gift", status=StepStatus.STARTED)
    winner = await claim_effect(exe, step, other.key(1))
    assert winner is not None and winner.run_id == other.run.id
    await exe.settle_held()
    assert (await world.step(exe.run.id, 1)).status == StepStatus.SUCCEEDED
    assert "step.succeeded" in await world.events(exe.run.id)
