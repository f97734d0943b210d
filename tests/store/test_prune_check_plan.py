"""What retention's "every record sealed" check reads, not how long it takes: with a
sealer backlog elsewhere in the store, checking a page of runs reads each run's own events
by run (``events_run_seq``), never the backlog (``events_unsealed``), whether once per run
or once for the page: no index of unsealed events by run is kept for it (migration
0196)."""

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
    running run, unsealed after the statistics were taken (as a backlog grows between two
    runs of autovacuum): the partial index of unsealed events then looks empty to the
    planner, which is when a check by ``hash IS NULL`` reads it."""
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
            d.execute(conn, event, {"id": "busy", "at": now, "seq": seq, "hash": "h"})
        d.commit(conn)
        if d.name == "postgres":
            conn.autocommit = True
            conn.execute("VACUUM ANALYZE")
            conn.autocommit = False
        else:
            conn.execute("ANALYZE")
        d.begin_write(conn)
        d.execute(conn, "UPDATE events SET hash = NULL WHERE run_id = 'busy'", {})
        d.commit(conn)
    finally:
        d.close(conn)
    return ids


def _scans_of(node: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """The plan's scans of ``table``; a bitmap's by the index scans under its heap scan."""
    found: list[dict[str, Any]] = []
    if node.get("Relation Name") == table:
        if node.get("Node Type") == "Bitmap Heap Scan":
            found += _index_scans(node)
        else:
            found.append(node)
    for child in node.get("Plans", []):
        if node.get("Relation Name") != table or node.get("Node Type") != "Bitmap Heap Scan":
            found += _scans_of(child, table)
    return found


def _index_scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node] if node.get("Node Type") == "Bitmap Index Scan" else []
    for child in node.get("Plans", []):
        found += _index_scans(child)
    return found


def _unsealed_check(store: Any, ids: list[str]) -> tuple[str, dict[str, Any]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    tx = Tx(store.dialect, None)
    tx.fetchall = lambda sql, params=None: seen.append((sql, params or {})) or []  # type: ignore[method-assign]
    prunable_runs(tx, Policy("t", 0.0), time.time(), ids)
    (found,) = seen
    return found


async def test_the_sealed_check_reads_each_runs_own_events_not_the_backlog(
    store_url: str,
) -> None:
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
                text = json.dumps(plan)[:3000]
                assert top["Actual Rows"] == RUNS
                # Each run's own events, read once (a bitmap reads them twice: its index
                # entries, then the rows): never the backlog, once per run or at all.
                assert rows_read(top) <= 2 * RUNS * (EVENTS + 1), text
                reads = _scans_of(top, "events")
                assert reads and all(n.get("Index Name") == "events_run_seq" for n in reads), text
                assert "events_unsealed" not in json.dumps(plan), text
            else:
                found = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
                details = " | ".join(str(r[-1]) for r in found)
                # Each run's events by run (its own rows), never the backlog by id.
                searches = [x for x in details.split(" | ") if x.startswith("SEARCH e ")]
                assert searches, details
                assert all("events_run_seq (run_id=?)" in x for x in searches), details
                assert "events_unsealed" not in details and "SCAN e" not in details, details
            d.rollback(conn)
        finally:
            d.close(conn)
    finally:
        await store.close()
