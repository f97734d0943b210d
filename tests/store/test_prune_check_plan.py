"""What retention's "every record sealed" check reads, not how long it takes: with a
sealer backlog elsewhere in the store, checking a page of runs reads each run's unsealed
events by run (none), never the whole backlog once per run."""

from __future__ import annotations

import json
import time
from typing import Any

from agentledger.store import open_store
from agentledger.store._queries.retention import Policy, prunable_runs
from agentledger.store._tx import Tx
from tests.store.pg_claims import rows_read

RUNS, EVENTS, BACKLOG = 200, 20, 3000


def _seed(store: Any) -> list[str]:
    """RUNS completed runs with EVENTS sealed events each; BACKLOG unsealed events of a
    running run."""
    d = store.dialect
    conn = d.connect()
    now = time.time() - 3600
    try:
        d.begin_write(conn)
        run = (
            "INSERT INTO runs (id, tenant_id, kind, name, version, target, status, created_at, "
            "updated_at) VALUES (:id, 't', 'workflow', 'w', '1', 'w@1', :status, :at, :at)"
        )
        event = (
            "INSERT INTO events (run_id, at, type, actor, data, seq, tenant_id, hash) "
            "VALUES (:id, :at, 'step.succeeded', 'w', '{}', :seq, 't', :hash)"
        )
        ids = [f"r{i:04d}" for i in range(RUNS)]
        for run_id in ids:
            d.execute(conn, run, {"id": run_id, "status": "completed", "at": now})
            for seq in range(EVENTS):
                d.execute(conn, event, {"id": run_id, "at": now, "seq": seq, "hash": "h"})
        d.execute(conn, run, {"id": "busy", "status": "running", "at": now})
        for seq in range(BACKLOG):
            d.execute(conn, event, {"id": "busy", "at": now, "seq": seq, "hash": None})
        d.commit(conn)
        if d.name == "postgres":
            conn.autocommit = True
            conn.execute("VACUUM ANALYZE")
            conn.autocommit = False
        else:
            conn.execute("ANALYZE")
    finally:
        d.close(conn)
    return ids


def _unsealed_check(store: Any, ids: list[str]) -> tuple[str, dict[str, Any]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    tx = Tx(store.dialect, None)
    tx.fetchall = lambda sql, params=None: seen.append((sql, params or {})) or []  # type: ignore[method-assign]
    prunable_runs(tx, Policy("t", 0.0), time.time(), ids)
    (found,) = seen
    return found


async def test_the_sealed_check_reads_each_runs_unsealed_events_by_run(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        ids = _seed(store)
        sql, params = _unsealed_check(store, ids)
        d = store.dialect
        conn = d.connect()
        try:
            if d.name == "postgres":
                from agentledger.store._postgres import convert_placeholders

                (row,) = conn.execute(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + convert_placeholders(sql), params
                ).fetchall()
                plan = next(iter(row.values())) if isinstance(row, dict) else row[0]
                top = plan[0]["Plan"]
                assert top["Actual Rows"] == RUNS
                # Each run's own rows, a few each: never the backlog once per run.
                assert rows_read(top) < RUNS * BACKLOG // 10, json.dumps(plan)[:3000]
                # By the index of unsealed events by run: with larger tables the planner
                # otherwise intersects the backlog (events_unsealed) with each run's rows.
                assert "events_unsealed_run" in json.dumps(plan), json.dumps(plan)[:3000]
            else:
                found = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
                details = " | ".join(str(r[-1]) for r in found)
                # Each run's events by run (its own rows), never the backlog by id.
                searches = [x for x in details.split(" | ") if x.startswith("SEARCH e ")]
                assert searches and all("(run_id=?)" in x for x in searches), details
            d.rollback(conn)
        finally:
            d.close(conn)
    finally:
        await store.close()
