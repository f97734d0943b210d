"""A batch in a group takes a savepoint only when it may be refused after it wrote
something (an effect key, an outbox key, an approval): a batch refused by its fence
wrote nothing, so it is refused alone without one -- two statements fewer per step."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agentledger.errors import LeaseLost
from agentledger.records import Effect
from agentledger.store import EffectClaimed, RunUpdate, Store
from tests.store.test_contract import TARGET, batch, new_run, step


def _recording(store: Store, seen: list[str]) -> None:
    """Every statement the store's connections run, in ``seen`` (the dialect object is
    the one every committer and the writer thread run their statements through)."""
    dialect = store.dialect
    for name in ("execute", "fetchall"):
        real = getattr(dialect, name)

        def call(conn: Any, sql: str, params: Any = None, _real: Any = real) -> Any:
            seen.append(sql)
            return _real(conn, sql, params)

        setattr(dialect, name, call)


async def _grouped(store: Store, batches: list[Any]) -> list[Any]:
    """Commit ``batches`` at once, the writer thread held so that its share lands in one
    group; the outcome of each."""
    gate = threading.Event()
    blocker = asyncio.ensure_future(store._call(lambda tx: gate.wait(10), write=False))
    await asyncio.sleep(0.05)
    commits = asyncio.gather(*(store.commit(b) for b in batches), return_exceptions=True)
    await asyncio.sleep(0.05)
    gate.set()
    await blocker
    return list(await commits)


@pytest.mark.parametrize("steps", [1, 3])  # 3: not one statement on PostgreSQL
async def test_a_fenced_out_batch_is_refused_alone_without_a_savepoint(
    store: Store, steps: int
) -> None:
    for _ in range(6):
        await store.create_run(new_run())
    runs = await store.claim_runs("w1", [TARGET], 6, 30)
    stale = runs[2]
    batches = []
    for run in runs:
        b = batch(
            run, steps=[step(run, n) for n in range(1, steps + 1)], run=RunUpdate(step_count=steps)
        )
        if run is stale:
            b.epoch -= 1
        batches.append(b)
    seen: list[str] = []
    _recording(store, seen)
    outcomes = await _grouped(store, batches)
    assert max(store.group_sizes) >= 5
    assert [type(o) for o in outcomes] == [LeaseLost if r is stale else type(None) for r in runs]
    assert not [s for s in seen if "SAVEPOINT" in s.upper()]
    for run in runs:
        journal = await store.load_journal(run.id)
        assert len(journal) == (0 if run is stale else steps)
        events = await store.list_events(run.id)
        assert len([e for e in events if e.type.startswith("step.")]) == len(journal)


async def test_a_batch_refused_after_its_writes_is_rolled_back_alone(store: Store) -> None:
    for _ in range(4):
        await store.create_run(new_run())
    runs = await store.claim_runs("w1", [TARGET], 4, 30)
    holder, taker = runs[0], runs[1]
    await store.commit(
        batch(holder, effects=[Effect(key="k", run_id=holder.id, step_no=1, status="claimed")])
    )
    batches = []
    for run in runs[1:]:
        b = batch(run, steps=[step(run, 1), step(run, 2)], run=RunUpdate(step_count=2))
        if run is taker:  # its fence and steps are written before the key is found taken
            b.effects = [Effect(key="k", run_id=run.id, step_no=2, status="claimed")]
        batches.append(b)
    outcomes = await _grouped(store, batches)
    assert isinstance(outcomes[0], EffectClaimed)
    assert outcomes[1:] == [None, None]
    assert await store.load_journal(taker.id) == []
    got = await store.get_run(taker.id)
    assert got is not None and got.step_count == 0
    for run in runs[2:]:
        assert len(await store.load_journal(run.id)) == 2
