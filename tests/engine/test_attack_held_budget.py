"""A budget reached at the boundary right after a held outcome (a plain write's boundary
does not commit it first): the run stops with every write it made durable, each called
once, and the step budget counts every journaled step."""

from __future__ import annotations

from typing import Any

import pytest

from agentledger import App, RunStatus, Status, ToolContext
from agentledger._budget import Budget
from agentledger.records import StepStatus
from agentledger.store import Store
from tests.engine.test_attack_held_next_steps import World, drain


@pytest.mark.parametrize("kind", ["steps", "time"])
async def test_a_budget_stop_after_a_held_outcome_keeps_it(store: Store, kind: str) -> None:
    app = App("attack-held-budget")
    applied: dict[str, Any] = {}
    calls: list[str] = []

    async def status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        return (
            Status.succeeded(applied[ctx.idempotency_key])
            if ctx.idempotency_key in applied
            else Status.not_found()
        )

    @app.tool(effect="write", idempotency="provider", status_check=status)
    async def book(ctx: ToolContext, item: str) -> Any:
        calls.append(ctx.idempotency_key)
        applied[ctx.idempotency_key] = {"booked": item}
        if kind == "time":
            import time

            time.sleep(0.4)  # the run's active time, spent inside the call
        return {"booked": item}

    budget = Budget(max_steps=3) if kind == "steps" else Budget(active_seconds=1.0)

    @app.workflow(name="many", budget=budget)
    async def many(ctx: Any, input: Any) -> Any:
        for i in range(10):
            await ctx.tool("book", item=f"b{i}")
        return {"done": True}

    world = World(store)
    world.app = app
    run_id = await app.submit(store, "many", {})
    run = await drain(world, run_id)
    assert run.status == RunStatus.NEEDS_HUMAN, run
    assert "budget" in (run.handover_reason or "")
    journal = await store.load_journal(run_id)
    assert journal and all(s.status == StepStatus.SUCCEEDED for s in journal), journal
    assert len(calls) == len(set(calls)) == len(journal)
    assert run.step_count == len(journal)
    if kind == "steps":
        assert len(journal) == 3
