"""Outbox keys are unique across runs: a key another run holds is refused, never dropped.

The insert stays ``ON CONFLICT DO NOTHING`` for the run that owns the key (a replayed
step writes its row again), but a later run whose tool built the same key must not lose
its row in silence. Each test runs on SQLite and PostgreSQL (``store``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentledger import App, RunStatus, ToolContext, Worker, WorkerConfig
from agentledger.records import OutboxItem, Run
from agentledger.store import OutboxKeyTaken, Store
from tests.store.test_contract import batch, claim_one, new_run, step


def _item(run: Run, key: str, step_no: int = 1, to: str = "a") -> OutboxItem:
    return OutboxItem(key=key, run_id=run.id, step_no=step_no, tool="email", payload={"to": to})


async def _claimed(store: Store) -> Run:
    await store.create_run(new_run())
    return await claim_one(store)


async def test_a_key_held_by_another_run_is_refused_with_both_named(store: Store) -> None:
    first = await _claimed(store)
    await store.commit(batch(first, steps=[step(first)], outbox=[_item(first, "welcome")]))
    second = await _claimed(store)
    with pytest.raises(OutboxKeyTaken) as refused:
        await store.commit(
            batch(second, steps=[step(second)], outbox=[_item(second, "welcome", to="b")])
        )
    message = str(refused.value)
    assert "'welcome'" in message and first.id in message and "outbox_key" in message
    assert (refused.value.run_id, refused.value.step_no) == (first.id, 1)
    # The refused batch wrote nothing (its journal entry neither), the first row stands.
    assert await store.load_journal(second.id) == []
    (row,) = await store.list_outbox()
    assert (row.run_id, row.payload) == (first.id, {"to": "a"})


async def test_the_owning_run_writing_its_key_again_is_a_no_op(store: Store) -> None:
    run = await _claimed(store)
    await store.commit(batch(run, outbox=[_item(run, "mail:1")]))
    await store.commit(batch(run, outbox=[_item(run, "mail:1", to="again")]))  # a replay
    (row,) = await store.list_outbox()
    assert row.payload == {"to": "a"}


async def test_a_refused_batch_does_not_fail_the_batches_committed_with_it(
    store: Store,
) -> None:
    """Group commit: the colliding batch fails alone, the others commit."""
    owner = await _claimed(store)
    await store.commit(batch(owner, outbox=[_item(owner, "shared")]))
    others = [await _claimed(store) for _ in range(4)]
    writes = [
        store.commit(batch(run, steps=[step(run)], outbox=[_item(run, f"own:{run.id}")]))
        for run in others[:3]
    ]
    writes.append(store.commit(batch(others[3], outbox=[_item(others[3], "shared")])))
    outcomes = await asyncio.gather(*writes, return_exceptions=True)
    assert outcomes[:3] == [None, None, None]
    assert isinstance(outcomes[3], OutboxKeyTaken)
    keys = {row.key: row.run_id for row in await store.list_outbox()}
    assert keys == {"shared": owner.id, **{f"own:{r.id}": r.id for r in others[:3]}}


def _collision_app() -> App:
    app = App("outbox-keys")

    @app.tool(effect="notify", delivery="outbox", outbox_key=lambda args, ctx: "newsletter")
    async def announce(ctx: ToolContext, text: str) -> dict[str, Any]:
        return {"sent": text}

    @app.workflow(name="announce")
    async def announce_flow(ctx: Any, input: Any) -> Any:
        return await ctx.tool("announce", text=input["text"])

    return app


async def _run_to_rest(store: Store, app: App, text: str) -> Run:
    run_id = await app.submit(store, "announce", {"text": text})
    worker = Worker(store, app, WorkerConfig(poll_seconds=0.02, outbox=False), burst=True)
    await worker.run(install_signals=False)
    run = await store.get_run(run_id)
    assert run is not None
    return run


async def test_a_run_whose_outbox_key_is_taken_goes_to_a_human(store: Store) -> None:
    """End to end: the second run of a tool with a run-blind key stops for a human,
    with the key and the run that holds it in its handover reason."""
    app = _collision_app()
    first = await _run_to_rest(store, app, "one")
    assert first.status == RunStatus.COMPLETED
    second = await _run_to_rest(store, app, "two")
    assert second.status == RunStatus.NEEDS_HUMAN
    reason = second.handover_reason or ""
    assert "'newsletter'" in reason and first.id in reason
    assert [e.type for e in await store.list_events(second.id)][-1] == "run.handover"
    (row,) = await store.list_outbox()
    assert (row.run_id, row.payload) == (first.id, {"args": {"text": "one"}})
