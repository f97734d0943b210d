"""The worker's line per run says where the execution left it -- steps, error, handover
reason, park time -- from what the engine wrote, without reading the run back from the
store. Real stores on each backend and the real worker."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from agentledger import App, Budget, Worker, WorkerConfig
from agentledger.engine._workflow_runner import WorkflowContext
from agentledger.store import Store
from agentledger.tools._context import ToolContext

app = App("run-log-tests")


@app.tool(effect="read")
async def echo(ctx: ToolContext, i: int) -> int:
    """Return ``i``."""
    return i


@app.workflow
async def two_steps(ctx: WorkflowContext, input: Any) -> str:
    await ctx.tool("echo", i=1)
    await ctx.tool("echo", i=2)
    return "done"


@app.workflow
async def broken(ctx: WorkflowContext, input: Any) -> str:
    await ctx.tool("echo", i=1)
    raise KeyError("day")


@app.workflow
async def sleeper(ctx: WorkflowContext, input: Any) -> str:
    await ctx.tool("echo", i=1)
    await ctx.sleep(3600)
    return "woke"


@app.workflow(budget=Budget(max_steps=1))
async def greedy(ctx: WorkflowContext, input: Any) -> str:
    await ctx.tool("echo", i=1)
    await ctx.tool("echo", i=2)
    return "never"


async def _drain(store: Store, ids: set[str]) -> None:
    pending = set(ids)
    worker = Worker(store, app, WorkerConfig(poll_seconds=0.01, outbox=False), burst=True)

    def finished(run_id: str, outcome: str) -> None:
        pending.discard(run_id)
        if not pending:
            worker.stop()

    worker.on_finished = finished
    await worker.run(install_signals=False)
    assert not pending


async def test_the_line_per_run_comes_from_the_execution_not_a_read_back(
    store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = {
        name: await app.submit(store, name, {})
        for name in ("two_steps", "broken", "sleeper", "greedy")
    }
    reads: list[str] = []
    get_run = store.get_run

    async def counted(run_id: str) -> Any:
        reads.append(run_id)
        return await get_run(run_id)

    monkeypatch.setattr(store, "get_run", counted)
    with caplog.at_level(logging.INFO, logger="agentledger.worker"):
        await _drain(store, set(ids.values()))
    monkeypatch.undo()
    lines = {
        run_id: [r.getMessage() for r in caplog.records if f"run {run_id} " in r.getMessage()]
        for run_id in ids.values()
    }
    assert reads == [], reads  # no run read back to say where it ended

    assert f"run {ids['two_steps']} completed in 2 steps" in lines[ids["two_steps"]]
    (failed,) = [line for line in lines[ids["broken"]] if " failed: " in line]
    assert "KeyError: 'day'" in failed and "Traceback" in failed
    (parked,) = [line for line in lines[ids["sleeper"]] if "waiting until" in line]
    assert re.search(r"waiting until \d\d:\d\d:\d\d \(sleeping until \d+\)$", parked), parked
    (human,) = [line for line in lines[ids["greedy"]] if "needs a human" in line]
    run = await store.get_run(ids["greedy"])
    assert run is not None and run.handover_reason and run.handover_reason in human

    # The lines say what the store holds.
    for name, steps in (("two_steps", 2), ("broken", 1), ("sleeper", 2), ("greedy", 1)):
        run = await store.get_run(ids[name])
        assert run is not None and run.step_count == steps, (name, run)
