"""A journal write on SQLite is three statements before its COMMIT: the fence (which
returns the event seqs it took), the step row and one INSERT of all the batch's events.
The per-step cost of the engine is mostly these statements (docs/benchmarks.md)."""

from __future__ import annotations

import collections
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentledger.store import open_store
from agentledger.store._sqlite import SQLiteDialect
from agentledger_bench import engine_runs


async def test_read_step_is_three_statements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    await store.open()
    seen: collections.Counter[str] = collections.Counter()
    execute, fetchall = SQLiteDialect.execute, SQLiteDialect.fetchall

    def counted(real: Any) -> Any:
        def call(self: Any, conn: Any, sql: str, params: Any = None) -> Any:
            seen[" ".join(sql.split()[:3])] += 1
            return real(self, conn, sql, params)

        return call

    try:
        monkeypatch.setattr(SQLiteDialect, "execute", counted(execute))
        monkeypatch.setattr(SQLiteDialect, "fetchall", counted(fetchall))
        await engine_runs.per_step_us(store, "bench_read_tool", 20)
    finally:
        await store.close()
    assert seen["SELECT event_seq FROM"] == 0
    # 20 steps plus the run's own writes (claim, completion): one events INSERT each
    assert 20 <= seen["INSERT INTO events"] <= 24
    assert seen["INSERT INTO steps"] == 20
    with sqlite3.connect(tmp_path / "j.db") as db:
        seqs = [r[0] for r in db.execute("SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))  # gapless, in the journal's transactions
