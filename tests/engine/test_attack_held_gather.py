"""Held outcomes under workflow code that runs writes concurrently (asyncio.gather).

A held outcome is committed when the run's code waits on anything but its next write:
two writes that return while a third is still being called are both durable while the
run waits on the third, not only the first of them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentledger import App, RunStatus, Status, ToolContext, Worker, WorkerConfig
from agentledger.records import StepStatus
from agentledger.store import Store


def gather_app(provider: dict[str, Any], release: asyncio.Event) -> App:
    app = App("attack-held-gather")

    async def status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        done = provider.get(ctx.idempotency_key)
        return Status.succeeded(done) if done else Status.not_found()

    @app.tool(effect="write", idempotency="provider", status_check=status, timeout=30)
    async def pay(ctx: ToolContext, item: str, delay: float = 0.0, wait: bool = False) -> Any:
        await asyncio.sleep(delay)
        if wait:
            await release.wait()
        provider[ctx.idempotency_key] = {"item": item}
        return {"item": item}

    @app.workflow(name="fan_out")
    async def fan_out(ctx: Any, input: Any) -> Any:
        return await asyncio.gather(
            ctx.tool("pay", item="a"),
            ctx.tool("pay", item="b", delay=0.3),
            ctx.tool("pay", item="c", wait=True),
        )

    return app


async def test_outcomes_that_return_while_a_sibling_is_called_are_all_durable(
    store: Store,
) -> None:
    provider: dict[str, Any] = {}
    release = asyncio.Event()
    app = gather_app(provider, release)
    run_id = await app.submit(store, "fan_out", {})
    worker = Worker(store, app, WorkerConfig(poll_seconds=0.02))
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        # a and b returned long ago; c is still being called.
        for _ in range(150):
            await asyncio.sleep(0.02)
            journal = {s.input["args"]["item"]: s.status for s in await store.load_journal(run_id)}
            if journal.get("a") == journal.get("b") == StepStatus.SUCCEEDED:
                break
        await asyncio.sleep(0.5)
        journal = {s.input["args"]["item"]: s.status for s in await store.load_journal(run_id)}
        assert journal == {
            "a": StepStatus.SUCCEEDED,
            "b": StepStatus.SUCCEEDED,
            "c": StepStatus.STARTED,
        }
        release.set()
        for _ in range(250):
            run = await store.get_run(run_id)
            assert run is not None
            if run.terminal:
                break
            await asyncio.sleep(0.02)
        assert run.status == RunStatus.COMPLETED
        assert [r["item"] for r in run.result] == ["a", "b", "c"]
        # Each journal fact has its event, once: every step started, then succeeded.
        facts = [
            (e.data["step_no"], e.type)
            for e in await store.list_events(run_id)
            if e.type.startswith("step.")
        ]
        for n in (1, 2, 3):
            assert [t for s, t in facts if s == n] == ["step.started", "step.succeeded"]
        assert sorted(provider) == sorted(
            s.idempotency_key for s in await store.load_journal(run_id)
        )
    finally:
        release.set()
        worker.stop()
        await task
