"""What the sealed audit records say of a run: every step's record names the key it
executed with, the policy decision that let it run and its spend; the run's ending
record carries its totals (docs/architecture.md, "The HTTP service")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import Agent, App, RunStatus, ScriptedModel, ToolContext, Turn
from tests.fast.lifecycle_harness import Harness


def make_app(charged: list[int]) -> App:
    app = App("audited")

    @app.tool(effect="money", idempotency="provider")
    async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
        charged.append(amount)
        return {"charged": amount}

    app.add_agent(
        Agent(
            name="cashier",
            model=ScriptedModel([Turn(calls=[("charge", {"amount": 40})]), Turn(text="done")]),
            instructions="charge 40",
            tools=[charge],
        )
    )
    return app


async def test_step_records_name_key_policy_and_spend_and_the_end_has_the_totals(
    tmp_path: Path,
) -> None:
    charged: list[int] = []
    async with Harness(tmp_path, make_app(charged)) as h:
        run = await h.drive(await h.submit("cashier", {"message": "charge 40"}))
        journal = await h.journal(run.id)
        events = await h.events(run.id)
    assert run.status == RunStatus.COMPLETED and charged == [40]
    assert run.cost_usd > 0 and run.tokens > 0
    steps = [e for e in events if e.type.startswith("step.")]
    (tool_step,) = [s for s in journal if s.kind == "tool"]
    executed = [e for e in steps if e.type == "step.succeeded" and e.data["name"] == "charge"]
    assert len(executed) == 1
    assert executed[0].data["key"] == tool_step.idempotency_key is not None
    assert executed[0].data["policy"] == "allow"  # an Allow is audited too, not only denials
    model_costs = [e.data.get("cost_usd", 0.0) for e in steps
                   if e.type == "step.succeeded" and e.data["kind"] == "model"]  # fmt: skip
    assert sum(model_costs) == pytest.approx(run.cost_usd)
    model_tokens = [e.data.get("tokens", 0) for e in steps
                    if e.type == "step.succeeded" and e.data["kind"] == "model"]  # fmt: skip
    assert sum(model_tokens) == run.tokens
    (completed,) = [e for e in events if e.type == "run.completed"]
    assert completed.data["cost_usd"] == pytest.approx(run.cost_usd)
    assert completed.data["tokens"] == run.tokens
    assert completed.data["steps"] == run.step_count
