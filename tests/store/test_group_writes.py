"""A group's batches are fenced one by one, then written together (journal.write_fenced):
several batches of one run in one group still take their own event seqs, in the order
they were submitted and without gaps, each hears its run's cancel request, and a later
batch's entry of a step replaces an earlier one's."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from agentledger.errors import LeaseLost, StoreError
from agentledger.records import Effect, Run, RunStatus
from agentledger.store import Store
from agentledger.store._base import Batch, NewEvent, RunUpdate
from agentledger.store._dialect import WouldBlock
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


def _marks(events: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(e["data"])["mark"] for e in events if e["type"] == "test.mark"]


def _plain(of: Run, mark: int, n_events: int, **kw: Any) -> Batch:
    """Three entries (PostgreSQL's writer thread, not its one-statement path) and
    ``n_events`` own events marked ``mark``."""
    events = [NewEvent("test.mark", "tester", {"mark": mark}) for _ in range(n_events)]
    steps = [step(of, 3 * mark + k, output={"mark": mark}) for k in range(1, 4)]
    return batch(of, steps=steps, events=events, **kw)


async def test_a_mixed_group_across_event_chunks_keeps_gapless_seqs(store: Store) -> None:
    """One group of every shape: accepted batches with a refused one between them (a
    stale epoch), an empty batch, one ending its run and one after it, one parking its
    run, and more events than one INSERT holds (batches straddle the chunk edges)."""
    for _ in range(3):
        await store.create_run(new_run())
    a, b, c = sorted(await store.claim_runs("w1", [TARGET], 3, 30), key=lambda r: r.id)
    before = {r.id: max(e["seq"] for e in await store.read(_events, r.id)) for r in (a, b, c)}
    stale = _plain(a, 1, 5)
    stale.epoch -= 1  # a writer whose lease moved on: refused by its fence
    ends = RunUpdate(status=RunStatus.COMPLETED, result={"ok": True})
    parks = RunUpdate(status=RunStatus.WAITING, available_at=time.time() + 60)
    shapes: list[tuple[Batch, bool]] = [  # (batch, accepted)
        (_plain(a, 0, 40), True),
        (stale, False),
        (_plain(a, 2, 30), True),
        (_plain(a, 3, 1, run=ends), True),
        (_plain(a, 4, 2), False),  # the run ended: refused
        (_plain(b, 0, 61), True),
        (batch(b), True),  # no entry, no event (on PostgreSQL: the loop's committer)
        (_plain(b, 1, 3), True),
        (_plain(c, 0, 2, run=parks), True),
        (_plain(c, 1, 2), False),  # the run is parked: refused
    ]
    store.group_sizes.clear()
    answers = await asyncio.gather(*(store.commit(s) for s, _ in shapes), return_exceptions=True)
    for (s, accepted), answer in zip(shapes, answers, strict=True):
        assert answer is None if accepted else isinstance(answer, LeaseLost), (s.run_id, answer)
    if store.url.startswith("sqlite"):
        assert max(store.group_sizes) == len(shapes)  # one group
    for run in (a, b, c):
        written = [s for s, ok in shapes if ok and s.run_id == run.id]
        events = [e for e in await store.read(_events, run.id) if e["seq"] > before[run.id]]
        n = sum(len(s.steps) + len(s.events) for s in written)
        first = before[run.id] + 1
        assert [e["seq"] for e in events] == list(range(first, first + n)), run.id
        expected = [e.data["mark"] for s in written for e in s.events]
        assert _marks(events) == expected  # in the order submitted
        journal = await store.load_journal(run.id)
        assert sorted(s.step_no for s in journal) == sorted(
            x.step_no for s in written for x in s.steps
        )


async def test_a_fallen_back_group_keeps_seqs_and_cancel_requests(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step row the database refuses (past 64 bits, validation skipped) fails the
    group's deferred writes: one batch at a time then, each of a run's batches takes
    its own seqs again (nothing stale from the failed attempt), the refused one fails
    alone and the others hear their run's cancel request."""
    from agentledger.store import _sqlstore as sqlstore

    monkeypatch.setattr(sqlstore.journal, "validate_batch", lambda batch: None)
    for _ in range(3):
        await store.create_run(new_run())
    a, b, c = sorted(await store.claim_runs("w1", [TARGET], 3, 30), key=lambda r: r.id)
    await store.cancel_run(c.id, "test", "tester")
    before = {r.id: max(e["seq"] for e in await store.read(_events, r.id)) for r in (a, b, c)}
    poisoned = _plain(b, 0, 2)
    poisoned.steps[1] = step(b, 2, tokens=2**70)
    batches = [_plain(a, 0, 2), _plain(a, 1, 70), poisoned, _plain(c, 0, 1), _plain(c, 1, 1)]
    store.group_sizes.clear()
    answers = await asyncio.gather(*(store.commit(x) for x in batches), return_exceptions=True)
    assert [x is None for x in answers] == [True, True, False, True, True], answers
    assert isinstance(answers[2], StoreError)
    if store.url.startswith("sqlite"):
        assert max(store.group_sizes) == 1  # the group fell back
    assert await store.load_journal(b.id) == []
    assert [e for e in await store.read(_events, b.id) if e["seq"] > before[b.id]] == []
    for run, mine in ((a, batches[:2]), (c, batches[3:])):
        events = [e for e in await store.read(_events, run.id) if e["seq"] > before[run.id]]
        n = sum(len(x.steps) + len(x.events) for x in mine)
        first = before[run.id] + 1
        assert [e["seq"] for e in events] == list(range(first, first + n)), run.id
        assert len(await store.load_journal(run.id)) == 6
        for x in mine:
            assert (x.cancel_requested is not None) == (run.id == c.id), run.id


async def test_a_group_failing_between_its_fences_and_its_writes_is_done_again_whole(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's writes fail after its fences: PostgreSQL loses the connection (the
    writer thread reconnects and runs the group again, ``_skip_committed`` first),
    SQLite finds the file locked (the group goes to a thread that waits). Every batch is
    then written once: no seq taken twice, none lost."""
    from agentledger.store import _groupcommit

    if store.url.startswith("sqlite"):
        failure: Exception = WouldBlock("locked by another process")
    else:
        import psycopg

        failure = psycopg.OperationalError("server closed the connection unexpectedly")
    real = _groupcommit.write_fenced
    calls: list[int] = []

    def failing_once(tx: Tx, batches: list[Batch]) -> None:
        calls.append(len(batches))
        if len(calls) == 1:
            raise failure
        real(tx, batches)

    monkeypatch.setattr(_groupcommit, "write_fenced", failing_once)
    for _ in range(2):
        await store.create_run(new_run())
    a, b = sorted(await store.claim_runs("w1", [TARGET], 2, 30), key=lambda r: r.id)
    before = {r.id: max(e["seq"] for e in await store.read(_events, r.id)) for r in (a, b)}
    batches = [_plain(a, 0, 3), _plain(a, 1, 3), _plain(b, 0, 3), _plain(b, 1, 3)]
    answers = await asyncio.gather(*(store.commit(x) for x in batches), return_exceptions=True)
    assert answers == [None] * len(batches)
    assert len(calls) >= 2 and calls[0] > 1  # a group failed, then was done again
    for run in (a, b):
        events = [e for e in await store.read(_events, run.id) if e["seq"] > before[run.id]]
        first = before[run.id] + 1
        assert [e["seq"] for e in events] == list(range(first, first + 12)), run.id
        assert _marks(events) == [0, 0, 0, 1, 1, 1]
        assert len(await store.load_journal(run.id)) == 6


async def test_a_lost_commit_reply_does_not_write_a_runs_earlier_batch_twice(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group of two batches of one run commits and its reply is lost: run again, the
    run's row holds the later batch's token only; the earlier one committed with it and
    must not be applied a second time (its events twice, under new seqs)."""
    if store.url.startswith("sqlite"):
        pytest.skip("a file loses no COMMIT reply")
    import psycopg

    from agentledger.store import _groupcommit

    dialect = store.dialect  # type: ignore[attr-defined]
    real_commit, real_writes = dialect.commit, _groupcommit.write_fenced
    armed: list[bool] = []

    def writes(tx: Tx, batches: list[Batch]) -> None:
        real_writes(tx, batches)
        if len(batches) > 1 and not armed:
            armed.append(True)  # this group's COMMIT commits, its reply is lost

    def commit(conn: Any) -> None:
        real_commit(conn)
        if armed == [True]:
            armed.append(False)
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(_groupcommit, "write_fenced", writes)
    monkeypatch.setattr(dialect, "commit", commit)
    await store.create_run(new_run())
    (a,) = await store.claim_runs("w1", [TARGET], 1, 30)
    before = max(e["seq"] for e in await store.read(_events, a.id))
    batches = [_plain(a, 0, 2), _plain(a, 1, 2)]
    answers = await asyncio.gather(*(store.commit(x) for x in batches), return_exceptions=True)
    assert answers == [None, None]
    assert armed == [True, False]  # the reply was lost
    events = [e for e in await store.read(_events, a.id) if e["seq"] > before]
    assert [e["seq"] for e in events] == list(range(before + 1, before + 11))
    assert _marks(events) == [0, 0, 1, 1]
