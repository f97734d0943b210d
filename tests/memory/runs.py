"""Running an agent to rest in-process (no worker subprocess) and reading rows with SQL."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg

from agentledger._app import App
from agentledger.engine._runner import execute_run
from agentledger.records import Run
from agentledger.store import Store
from agentledger.store._sqlite import sqlite_path


async def run_to_rest(
    store: Store,
    app: App,
    name: str,
    input: Any,
    *,
    tenant_id: str = "default",
    user_id: str | None = None,
) -> Run:
    """Submit a run, claim it, execute it until it rests; return its row."""
    run_id = await app.submit(store, name, input, tenant_id=tenant_id, user_id=user_id)
    definition = app.resolve(name)
    claimed = await store.claim_runs(
        "test-owner", [f"{definition.name}@{definition.version}"], 1, 30
    )
    assert [r.id for r in claimed] == [run_id]
    await execute_run(store, app, claimed[0], "test-owner")
    run = await store.get_run(run_id)
    assert run is not None
    return run


def count(store_url: str, sql: str, params: tuple[Any, ...] = ()) -> int:
    """One number from the database at ``store_url``, by plain SQL (``?`` placeholders)."""
    if store_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(store_url)[0])
        try:
            return int(conn.execute(sql, params).fetchone()[0])
        finally:
            conn.close()
    with psycopg.connect(store_url) as pg:
        row = pg.execute(sql.replace("?", "%s"), params).fetchone()
        assert row is not None
        return int(row[0])
