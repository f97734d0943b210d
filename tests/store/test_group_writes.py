"""A group's batches are fenced one by one, then written together (journal.write_fenced):
several batches of one run in one group still take their own event seqs, in the order
they were submitted and without gaps, each hears its run's cancel request, and a later
batch's entry of a step replaces an earlier one's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentledger.records import Effect
from agentledger.store import Store
from agentledger.store._base import NewEvent
from agentledger.store._tx import Tx
from tests.store.test_contract import TARGET, batch, new_run, step

RUNS = 4
PER_RUN = 3


def _events(tx: Tx, run_id: str) -> list[dict[str, Any]]:
    sql = "SELECT seq, type, data FROM events WHERE run_id = :r ORDER BY id"
    return tx.fetchall(sql, {"r": run_id})


async def test_batches_of_one_run_in_one_group_keep_their_seqs(store: Store) -> None:
    for _ in range(RUNS):
        await store.create_run(new_run())
    runs = sorted(await store.claim_runs("w1", [TARGET], RUNS, 30), key=lambda r: r.id)
    assert len(runs) == RUNS
    cancelled = runs[1].id
    await store.cancel_run(cancelled, "test", "tester")
    before = {r.id: [e["seq"] for e in await store.read(_events, r.id)] for r in runs}
    batches = []
    for run in runs:
        for k in range(PER_RUN):
            # Step 1 in every batch (the last one's entry stands), one own event each.
            entry = step(run, 1, output={"batch": k})
            events = [NewEvent("test.mark", "tester", {"batch": k})]
            batches.append(batch(run, steps=[entry], events=events))
    store.group_sizes.clear()
    answers = await asyncio.gather(*(store.commit(b) for b in batches))
    assert answers == [None] * len(batches)
    assert max(store.group_sizes) == len(batches)  # one group, not one batch at a time
    for run in runs:
        events = [e for e in await store.read(_events, run.id) if e["seq"] not in before[run.id]]
        seqs = [e["seq"] for e in events]
        first = max(before[run.id]) + 1
        assert seqs == list(range(first, first + 2 * PER_RUN)), run.id  # gapless
        # Each batch's step event, then its own event, batch after batch.
        assert [e["type"] for e in events] == ["step.succeeded", "test.mark"] * PER_RUN
        marks = [json.loads(e["data"])["batch"] for e in events if e["type"] == "test.mark"]
        assert marks == list(range(PER_RUN)), run.id
        (entry,) = await store.load_journal(run.id)
        assert entry.output == {"batch": PER_RUN - 1}
    for b in batches:
        assert (b.cancel_requested is not None) == (b.run_id == cancelled), b.run_id


async def test_a_run_with_a_keyed_batch_between_plain_ones_keeps_its_seqs(store: Store) -> None:
    """A batch that claims a key is applied whole under its savepoint; plain batches of
    the same run in the same group must not take the seqs it took (the count-back of
    the seqs read after the fences would hand them out twice)."""
    await store.create_run(new_run())
    (run,) = await store.claim_runs("w1", [TARGET], 1, 30)
    before = [e["seq"] for e in await store.read(_events, run.id)]
    kinds = ["plain", "keyed", "plain"]
    batches = []
    for k, kind in enumerate(kinds):
        events = [NewEvent("test.mark", "tester", {"batch": k})]
        effects = [Effect(f"{run.id}:effect:{k}", run.id, k + 1, "started")]
        extra = {"effects": effects} if kind == "keyed" else {}
        batches.append(batch(run, steps=[step(run, k + 1)], events=events, **extra))
    store.group_sizes.clear()
    answers = await asyncio.gather(*(store.commit(b) for b in batches))
    assert answers == [None] * len(batches)
    if store.url.startswith("sqlite"):  # PostgreSQL commits plain batches on another path
        assert max(store.group_sizes) == len(batches)  # one group, not one at a time
    events = [e for e in await store.read(_events, run.id) if e["seq"] not in before]
    first = max(before) + 1
    assert [e["seq"] for e in events] == list(range(first, first + 2 * len(kinds)))
    marks = [json.loads(e["data"])["batch"] for e in events if e["type"] == "test.mark"]
    if store.url.startswith("sqlite"):  # one group: in the order submitted
        assert marks == list(range(len(kinds)))
    else:  # the keyed batch took the writer thread, the plain ones the loop's committer
        assert sorted(marks) == list(range(len(kinds)))
