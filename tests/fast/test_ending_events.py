"""A run's ending event records the run as that write left it: the same status, error
and handover reason as its row (webhooks report the event, not the row later)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, RunStatus, WorkflowContext
from agentledger._budget import Budget
from tests.fast.lifecycle_harness import Harness


async def _noop() -> str:
    return "ok"


def make_app() -> App:
    app = App("ending-events")

    @app.workflow(name="done", version="1")
    async def done(ctx: WorkflowContext, input: Any) -> Any:
        await ctx.step("one", _noop)
        return {"answer": 42}

    @app.workflow(name="boom", version="1")
    async def boom(ctx: WorkflowContext, input: Any) -> Any:
        await ctx.step("one", _noop)
        raise KeyError("day")

    @app.workflow(name="over", version="1", budget=Budget(max_steps=1))
    async def over(ctx: WorkflowContext, input: Any) -> Any:
        await ctx.step("one", _noop)
        await ctx.step("two", _noop)

    return app


@pytest.mark.parametrize(
    ("name", "event", "status"),
    [
        ("done", "run.completed", RunStatus.COMPLETED),
        ("boom", "run.failed", RunStatus.FAILED),
        ("over", "run.handover", RunStatus.NEEDS_HUMAN),
    ],
)
async def test_the_ending_event_records_the_run_as_its_row(
    tmp_path: Path, name: str, event: str, status: str
) -> None:
    async with Harness(tmp_path, make_app()) as h:
        run = await h.drive(await h.submit(name))
        (ending,) = [e for e in await h.events(run.id) if e.type == event]
    assert run.status == status
    assert ending.data["run"] == {  # the result stays in the row alone (a completed run is final)
        "status": run.status,
        "error": run.error,
        "handover_reason": run.handover_reason,
    }
    assert ending.data["steps"] == run.step_count  # the audit totals are still there
