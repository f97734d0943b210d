"""In a group, every batch gets its own outcome: committed, or refused by its own fence
(:class:`LeaseLost`), and the cancel request of its own run -- whatever the shapes (the
statement texts) of the batches committed with it."""

from __future__ import annotations

import asyncio

from agentledger.errors import LeaseLost
from agentledger.store import Store
from tests.store.test_contract import TARGET, batch, new_run, step

RUNS = 12


async def test_each_batch_of_a_group_gets_its_own_answer(store: Store) -> None:
    for _ in range(RUNS):
        await store.create_run(new_run())
    runs = sorted(await store.claim_runs("w1", [TARGET], RUNS, 30), key=lambda r: r.id)
    assert len(runs) == RUNS
    fenced_out = {r.id for i, r in enumerate(runs) if i % 4 == 1}
    cancelled = {r.id for i, r in enumerate(runs) if i % 3 == 0}
    for run_id in cancelled:
        await store.cancel_run(run_id, "test", "tester")
    batches = []
    for i, run in enumerate(runs):
        # Three shapes (one entry, two entries, an event only): three statement texts,
        # interleaved in run-id order.
        steps = [step(run, 1)] if i % 3 == 0 else [step(run, 1), step(run, 2)]
        if i % 3 == 2:
            steps = []
        b = batch(run, steps=steps)
        if run.id in fenced_out:
            b.epoch += 1  # not the run's epoch: its fence fails
        batches.append(b)
    store.group_sizes.clear()
    answers = await asyncio.gather(*(store.commit(b) for b in batches), return_exceptions=True)
    assert max(store.group_sizes) > 1  # they were committed together
    for run, b, answer in zip(runs, batches, answers, strict=True):
        if run.id in fenced_out:
            assert isinstance(answer, LeaseLost), (run.id, answer)
            assert await store.load_journal(run.id) == []
        else:
            assert answer is None, (run.id, answer)
            assert len(await store.load_journal(run.id)) == len(b.steps)
            assert (b.cancel_requested is not None) == (run.id in cancelled), run.id
