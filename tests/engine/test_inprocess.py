"""Engine behaviour that needs no subprocess: garbage from a model, tools that crash."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentledger import (
    Agent,
    App,
    Model,
    ModelRequest,
    ModelResponse,
    RunStatus,
    ScriptedModel,
    Status,
    ToolContext,
    Turn,
    Worker,
    WorkerConfig,
    open_store,
)
from agentledger.store import Store


class GarbageModel(Model):
    name = "garbage"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return "I am not a response"  # type: ignore[return-value]


def make_app(provider: dict[str, Any]) -> App:
    app = App("inprocess")

    @app.tool(effect="read")
    async def crashing_read(ctx: ToolContext, q: str) -> dict[str, Any]:
        raise RuntimeError("bug in the tool")

    async def status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        done = provider.get(ctx.idempotency_key)
        return Status.succeeded(done) if done else Status.not_found()

    @app.tool(effect="write", idempotency="provider", status_check=status)
    async def crash_after_write(ctx: ToolContext, item: str) -> dict[str, Any]:
        provider.setdefault(ctx.idempotency_key, {"item": item})
        provider["calls"] = provider.get("calls", 0) + 1
        raise RuntimeError("connection reset after the provider applied it")

    app.add_agent(Agent(name="garbage", model=GarbageModel(), instructions="x", tools=[]))
    app.add_agent(
        Agent(
            name="crashy",
            model=ScriptedModel(
                [Turn(calls=[("crashing_read", {"q": "x"})]), Turn(text="sorry, no data")]
            ),
            instructions="x",
            tools=[crashing_read],
        )
    )

    @app.workflow(name="write_then_crash")
    async def write_then_crash(ctx: Any, input: Any) -> Any:
        return await ctx.tool("crash_after_write", item="i1")

    return app


async def drain(store: Store, app: App, run_id: str, **config: Any) -> Any:
    """Run an in-process worker until ``run_id`` is terminal; return the run."""
    worker = Worker(store, app, WorkerConfig(poll_seconds=0.02, **config))
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        for _ in range(500):
            run = await store.get_run(run_id)
            assert run is not None
            if run.terminal:
                return run
            await asyncio.sleep(0.02)
        raise AssertionError(f"run {run_id} did not finish")
    finally:
        worker.stop()
        await task


async def run_to_rest(store: Store, app: App, name: str) -> Any:
    return await drain(store, app, await app.submit(store, name, {"message": "go"}))


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_a_model_returning_garbage_hands_over_cleanly(sqlite_store: Store) -> None:
    run = await run_to_rest(sqlite_store, make_app({}), "garbage")
    assert run.status == RunStatus.NEEDS_HUMAN
    assert "not a ModelResponse" in (run.handover_reason or "")
    assert "Traceback" not in (run.error or "") and run.error


async def test_a_read_tool_that_raises_is_told_to_the_model(sqlite_store: Store) -> None:
    run = await run_to_rest(sqlite_store, make_app({}), "crashy")
    journal = await sqlite_store.load_journal(run.id)
    assert run.status == RunStatus.COMPLETED
    tool_step = journal[1]
    assert (tool_step.status, tool_step.error_class) == ("failed", "tool_error")
    assert "bug in the tool" in (tool_step.error or "")
    assert run.result == {"answer": "sorry, no data"}


async def test_a_write_tool_that_raises_is_an_unknown_outcome_resolved_by_status(
    sqlite_store: Store,
) -> None:
    provider: dict[str, Any] = {}
    run = await run_to_rest(sqlite_store, make_app(provider), "write_then_crash")
    events = [e.type for e in await sqlite_store.list_events(run.id)]
    assert run.status == RunStatus.COMPLETED
    assert provider["calls"] == 1  # never called a second time
    assert run.result == {"item": "i1"}
    assert "tool.unknown_outcome" in events and "tool.status_resolved" in events


async def test_a_store_error_mid_run_abandons_it_for_resume_not_failure(tmp_path: Path) -> None:
    """The database failing is not the run failing: the run is left to be resumed."""
    from agentledger.errors import StoreError
    from agentledger.store._base import Batch

    class FlakyStore(Store):
        commits = 0

        async def commit(self, batch: Batch) -> None:
            FlakyStore.commits += 1
            if FlakyStore.commits == 3:
                raise StoreError("PostgreSQL error: deadlock detected")
            await super().commit(batch)

    from agentledger.store._sqlite import SQLiteDialect

    store = FlakyStore(SQLiteDialect(f"sqlite:///{tmp_path / 'a.db'}"))
    await store.open()
    app = make_app({})
    try:
        run_id = await app.submit(store, "crashy", {"message": "go"})
        run = await drain(store, app, run_id, lease_seconds=0.5)
    finally:
        await store.close()
    assert run.status == RunStatus.COMPLETED, run
    assert run.resumes >= 1  # re-claimed after its lease expired


async def test_a_run_that_keeps_losing_its_worker_is_handed_over(sqlite_store: Store) -> None:
    app = make_app({})
    run_id = await app.submit(sqlite_store, "crashy", {"message": "go"})
    for _ in range(4):  # four owners that died holding it (leases already expired)
        (claimed,) = await sqlite_store.claim_runs("dead-worker", ["crashy@1"], 1, -1)
    assert claimed.resumes == 3
    run = await drain(sqlite_store, app, run_id, max_resumes=3)
    journal = await sqlite_store.load_journal(run_id)
    assert run.status == RunStatus.NEEDS_HUMAN
    assert "resumed 4 times" in (run.handover_reason or "")
    assert journal == []  # nothing re-executed
