"""A held outcome followed by each other kind of step: a ``ctx.step`` function, a read,
a model call, a durable sleep, an outbox write, a failure that compensates. What runs
code before its own journal write finds the held outcome durable already; every write
is called once per key; every journal fact has its event once, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentledger import (
    Agent,
    App,
    ModelRequest,
    ModelResponse,
    RunStatus,
    ScriptedModel,
    Status,
    ToolContext,
    Turn,
    Worker,
    WorkerConfig,
)
from agentledger.records import StepStatus
from agentledger.store import Store
from agentledger.tools._contract import Compensation


class World:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.applied: dict[str, Any] = {}
        self.calls: list[str] = []
        self.seen: list[list[str]] = []  # the journal's statuses each time code ran
        self.app = self._app()

    async def look(self, run_id: str) -> None:
        self.seen.append([s.status for s in await self.store.load_journal(run_id)])

    def _app(self) -> App:
        app, world = App("attack-held-next"), self

        async def status(ctx: ToolContext, args: dict[str, Any]) -> Status:
            done = world.applied.get(ctx.idempotency_key)
            return Status.succeeded(done) if done else Status.not_found()

        @app.tool(effect="write", idempotency="provider", status_check=status)
        async def refund(ctx: ToolContext, item: str) -> Any:
            world.calls.append(ctx.idempotency_key)
            world.applied[ctx.idempotency_key] = {"refunded": item}
            return {"refunded": item}

        @app.tool(
            effect="write",
            idempotency="provider",
            status_check=status,
            compensation=Compensation("refund", lambda args, result: {"item": args["item"]}),
        )
        async def book(ctx: ToolContext, item: str) -> Any:
            world.calls.append(ctx.idempotency_key)
            world.applied[ctx.idempotency_key] = {"booked": item}
            return {"booked": item}

        @app.tool(effect="read")
        async def look(ctx: ToolContext) -> Any:
            await world.look(ctx.run_id)
            return {"ok": True}

        @app.tool(effect="notify", delivery="outbox")
        async def notify(ctx: ToolContext, msg: str) -> Any:
            return {"sent": msg}

        async def local(run_id: str) -> str:
            await world.look(run_id)
            return "ok"

        @app.workflow(name="flow")
        async def flow(ctx: Any, input: Any) -> Any:
            await ctx.tool("book", item="a")
            then = input["then"]
            if then == "step":
                await ctx.step("local", local, ctx.run_id)
            elif then == "read":
                await ctx.tool("look")
            elif then == "sleep":
                await ctx.sleep(0.05)
            elif then == "outbox":
                await ctx.tool("notify", msg="hi")
            await ctx.tool("book", item="b")
            if then == "fail":
                raise ValueError("changed plans")
            return {"done": then}

        class Looking(ScriptedModel):
            async def complete(self, request: ModelRequest) -> ModelResponse:
                await world.look(str(request.metadata.get("run_id")))
                return await super().complete(request)

        app.add_agent(
            Agent(
                name="agent",
                model=Looking(
                    [
                        Turn(calls=[("book", {"item": "a"})]),
                        Turn(calls=[("book", {"item": "b"})]),
                        Turn(text="done"),
                    ]
                ),
                instructions="x",
                tools=[book],
            )
        )
        return app


async def drain(world: World, run_id: str) -> Any:
    worker = Worker(world.store, world.app, WorkerConfig(poll_seconds=0.02))
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        for _ in range(500):
            run = await world.store.get_run(run_id)
            assert run is not None
            if run.terminal:
                return run
            await asyncio.sleep(0.02)
        raise AssertionError(f"run {run_id} did not finish")
    finally:
        worker.stop()
        await task


@pytest.mark.parametrize("then", ["step", "read", "sleep", "outbox", "fail", "agent"])
async def test_a_held_outcome_before_each_kind_of_step(store: Store, then: str) -> None:
    world = World(store)
    if then == "agent":
        run_id = await world.app.submit(store, "agent", {"message": "go"})
    else:
        run_id = await world.app.submit(store, "flow", {"then": then})
    run = await drain(world, run_id)
    assert run.status == (RunStatus.FAILED if then == "fail" else RunStatus.COMPLETED), run
    journal = await store.load_journal(run_id)
    # Code that ran after the first write (a step function, a read, the model) saw it
    # durable: nothing ``started`` in the journal while it ran.
    if then in ("step", "read", "agent"):
        assert world.seen and all(StepStatus.STARTED not in seen for seen in world.seen)
    assert sorted(world.calls) == sorted(set(world.calls))  # once per key
    assert all(s.status == StepStatus.SUCCEEDED for s in journal if s.kind != "sleep"), journal
    books = [s for s in journal if s.name == "book"]
    assert [s.status for s in books] == [StepStatus.SUCCEEDED] * 2
    if then == "fail":
        refunds = [s for s in journal if s.name == "refund"]
        assert [s.status for s in refunds] == [StepStatus.SUCCEEDED] * 2
    events = await store.list_events(run_id)
    for step in journal:
        facts = [
            e.type
            for e in events
            if e.type.startswith("step.") and e.data["step_no"] == step.step_no
        ]
        assert facts[-1] == f"step.{step.status}", (step.step_no, facts)
        assert len(facts) == len(set(facts)), (step.step_no, facts)
