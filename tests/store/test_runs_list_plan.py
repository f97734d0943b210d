"""What ``runs list --status S`` reads, not how long it takes: with a large history of
completed runs and a few runs in a rare state (needs_human, expired, failed), the first
page is read through the (status, created_at) index, never by walking the history."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from agentledger.store import open_store
from agentledger.store._queries.runs import list_runs
from agentledger.store._tx import Tx
from tests.store.pg_claims import rows_read

HISTORY = 5000


def _list_sql(store: Any, status: str) -> tuple[str, dict[str, Any]]:
    """The statement ``runs list --status`` runs, as the store sends it."""
    seen: list[tuple[str, dict[str, Any]]] = []
    tx = Tx(store.dialect, None)
    tx.fetchall = lambda sql, params=None: seen.append((sql, params or {})) or []  # type: ignore[method-assign]
    list_runs(tx, status=status, limit=50)
    (found,) = seen
    return found


def _seed(store: Any) -> None:
    """HISTORY completed runs over a year, then 3 needing a human, the oldest of all."""
    d = store.dialect
    conn = d.connect()
    try:
        d.begin_write(conn)
        now = time.time()
        for i in range(HISTORY + 3):
            status = "needs_human" if i < 3 else "completed"
            at = now - 365 * 86400 + i * 60
            d.execute(
                conn,
                "INSERT INTO runs (id, tenant_id, kind, name, version, target, status, "
                "created_at, updated_at) VALUES (:id, 'default', 'workflow', 'w', '1', 'w@1', "
                ":status, :at, :at)",
                {"id": f"r{i:05d}", "status": status, "at": at},
            )
        d.commit(conn)
        if d.name == "postgres":
            conn.autocommit = True
            conn.execute("VACUUM ANALYZE runs")
            conn.autocommit = False
        else:
            conn.execute("ANALYZE")
    finally:
        d.close(conn)


async def test_a_rare_status_is_listed_without_walking_the_history(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        _seed(store)
        sql, params = _list_sql(store, "needs_human")
        d = store.dialect
        conn = d.connect()
        try:
            if d.name == "postgres":
                # The driver prepares a statement run often, and PostgreSQL may then plan
                # it once for any value (the generic plan): what it reads must be right
                # for that plan too, whatever state the values are for.
                names = re.findall(r"(?<!:):(\w+)", sql)
                numbered = re.sub(r"(?<!:):(\w+)", lambda m: f"${names.index(m[1]) + 1}", sql)
                values = ", ".join(f"'{params[n]}'" for n in dict.fromkeys(names))
                conn.execute("SET plan_cache_mode = force_generic_plan")
                conn.execute(f"PREPARE listing AS {numbered}")
                (row,) = conn.execute(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE listing({values})"
                ).fetchall()
                plan = next(iter(row.values())) if isinstance(row, dict) else row[0]
                top = plan[0]["Plan"]
                assert top["Actual Rows"] == 3
                assert rows_read(top) < HISTORY // 10, json.dumps(plan)[:3000]
            else:
                found = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
                details = " | ".join(str(r[-1]) for r in found)
                assert "SEARCH runs USING INDEX runs_status_created (status=?)" in details, details
            d.rollback(conn)
        finally:
            d.close(conn)
    finally:
        await store.close()
