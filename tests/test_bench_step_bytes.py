"""Bytes stored per journaled step (docs/benchmarks.md, "A step written once: bytes per
step").

Sizes are exact, unlike times, so this is a test: a 500-step run of ``ctx.step`` calls
each returning a 500-character string, measured exactly as ``agentledger bench`` figure
(e) measures it (``agentledger_bench.storage``: SQLite, the growth of every b-tree's used
bytes from an empty run; PostgreSQL, ``pg_column_size`` of the run's ``runs``, ``steps``
and ``events`` rows minus an empty run's), on both backends.

The one value whose size depends on the host is the worker's id, the actor of each step
event (it holds the host name): it is counted at a fixed length so that the bound is the
same on every machine.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agentledger.store import open_store
from agentledger_bench.storage import postgres_bytes, sqlite_bytes

STEPS = 500
PAYLOAD = 500
ACTOR_LENGTH = 64  # the worker's id counted at this length, whatever the host's name

# Stored bytes of a step over its 500-byte output, at most. The journal row is about
# 1.2 times the output on either store; the rest is the step's event in the audit chain.
BOUND = 2.05


def _actors(rows: list[tuple[str]]) -> tuple[int, int]:
    """(step events, characters of their actors beyond ACTOR_LENGTH)."""
    return len(rows), sum(len(actor) - ACTOR_LENGTH for (actor,) in rows)


_STEP_ACTORS = "SELECT actor FROM events WHERE type LIKE 'step.%%' AND run_id = %s"


async def _measure(backend: str, store_url: str, tmp_path: Path) -> tuple[float, int]:
    """(stored bytes over the payload with actors at ACTOR_LENGTH, step events)."""
    if backend == "sqlite":
        found = await sqlite_bytes(tmp_path, STEPS, PAYLOAD)
        grown = found["dbstat_used_growth"]
        with sqlite3.connect(tmp_path / f"bytes-{STEPS}.db") as conn:
            (run_id,) = conn.execute(
                "SELECT run_id FROM steps GROUP BY run_id HAVING COUNT(*) = ?", (STEPS,)
            ).fetchone()
            rows = conn.execute(_STEP_ACTORS.replace("%%", "%").replace("%s", "?"), (run_id,))
            events, extra = _actors(rows.fetchall())
    else:
        import psycopg

        store = open_store(store_url)
        await store.open()
        try:
            found = await postgres_bytes(store, store_url, STEPS, PAYLOAD)
        finally:
            await store.close()
        grown = found["row_growth"]
        with psycopg.connect(store_url) as conn:
            row = conn.execute(
                "SELECT run_id FROM steps GROUP BY run_id HAVING COUNT(*) = %s", (STEPS,)
            ).fetchone()
            assert row is not None
            rows = conn.execute(_STEP_ACTORS, (row[0],)).fetchall()
            events, extra = _actors([(str(r[0]),) for r in rows])
    return (grown - extra) / (STEPS * PAYLOAD), events


async def test_a_step_is_stored_within_the_bound(
    backend: str, store_url: str, tmp_path: Path
) -> None:
    ratio, events = await _measure(backend, store_url, tmp_path)
    assert events == STEPS  # one step event per journal write, as measured
    assert ratio <= BOUND, f"{backend}: {ratio:.3f} x the payload stored per step"
