"""A journal write on SQLite: its fence (an UPDATE; SQLite's RETURNING costs more than
a read after it), then its writes together with those of the batches fenced in the
same group: one read of their runs' event seqs and cancel requests, their step rows by
one ``executemany`` and their events by multi-row INSERTs (up to 64 rows each). The
per-step cost of the engine is mostly these statements (docs/benchmarks.md)."""

from __future__ import annotations

import collections
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentledger.store import open_store
from agentledger.store._sqlite import SQLiteDialect
from agentledger_bench import engine_runs


def _count(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()

    def counted(real: Any, how: str) -> Any:
        def call(self: Any, conn: Any, sql: str, params: Any = None) -> Any:
            seen[how + " " + " ".join(sql.split()[:3])] += 1
            if how == "many":
                seen["rows " + " ".join(sql.split()[:3])] += len(params)
            return real(self, conn, sql, params)

        return call

    for how in ("execute", "fetchall", "executemany"):
        real = getattr(SQLiteDialect, how)
        label = "many" if how == "executemany" else "one"
        monkeypatch.setattr(SQLiteDialect, how, counted(real, label))
    return seen


async def test_read_step_statements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    await store.open()
    try:
        seen = _count(monkeypatch)
        await engine_runs.per_step_us(store, "bench_read_tool", 20)
    finally:
        await store.close()
    assert seen["one SELECT event_seq FROM"] == 0
    # 20 steps plus the run's own writes (its completion): a fence and a read each.
    assert 21 <= seen["one SELECT id, event_seq,"] <= 22
    assert seen["one INSERT INTO steps"] == 20  # a lone row: one execute
    # 20 steps plus the run's own writes (claim, completion): one events INSERT each
    assert 20 <= seen["one INSERT INTO events"] <= 24
    with sqlite3.connect(tmp_path / "j.db") as db:
        seqs = [r[0] for r in db.execute("SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))  # gapless, in the journal's transactions


async def test_a_group_writes_its_steps_and_events_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    await store.open()
    try:
        await engine_runs.concurrent(store, 5, 2)  # warm: the first claims and statements
        store.group_sizes.clear()
        seen = _count(monkeypatch)
        await engine_runs.concurrent(store, 40, 5)
        groups = list(store.group_sizes)
    finally:
        await store.close()
    assert max(groups) > 1
    # Each batch its own fence; the group's read and its writes once per group (the
    # events a few INSERTs, up to 64 rows each; claims add their own).
    assert seen["one UPDATE runs SET"] >= sum(groups)
    assert seen["one SELECT id, event_seq,"] <= len(groups)
    assert seen["many INSERT INTO steps"] <= len(groups)
    # A group's lone step row is one execute (a group of one, or one whose other
    # batches carry none): every row written once either way.
    assert seen["rows INSERT INTO steps"] + seen["one INSERT INTO steps"] == 40 * 5
    assert seen["one INSERT INTO events"] < sum(groups) / 4
    with sqlite3.connect(tmp_path / "j.db") as db:
        gaps = db.execute(
            "SELECT COUNT(*) FROM (SELECT run_id, MAX(seq) - MIN(seq) + 1 - COUNT(*) AS gap "
            "FROM events GROUP BY run_id) WHERE gap != 0"
        ).fetchone()[0]
    assert gaps == 0
