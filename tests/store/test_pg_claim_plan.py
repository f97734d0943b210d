"""What PostgreSQL's claim reads, not how long it takes: rows visited, from EXPLAIN
ANALYZE, with a backlog beyond the claim's shortcuts."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agentledger.store._postgres import PostgresDialect, connect, convert_placeholders
from tests.store.pg_claims import claim_params, ctes, explain_claim, rows_read

pytestmark = pytest.mark.postgres

TARGET = "w@1"


def _seed(conn: Any, backlog: int, tenants: int = 1) -> None:
    """``backlog`` due runs of one tenant (or spread over ``tenants``), r00000 the
    oldest."""
    now = time.time()
    with conn.cursor().copy(
        "COPY runs (id, tenant_id, kind, name, version, target, input, status, "
        "created_at, updated_at, available_at) FROM STDIN"
    ) as copy:
        for i in range(backlog):
            at = now - 3600 + i * 0.1
            tenant = "default" if tenants == 1 else f"t{i % tenants:05d}"
            copy.write_row((f"r{i:05d}", tenant, "workflow", "w", "1", TARGET, "{}",
                            "queued", at, at, at))  # fmt: skip
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE runs")
    conn.autocommit = False


def test_one_tenants_backlog_is_not_walked(pg_url: str) -> None:
    """One tenant (a deployment that never set one: every run is 'default'), 5,000 due
    runs: the planner reads the tenant's window from runs_claimable, filtering on the
    tenant. The tenant hop's last row (no next tenant) must not be looked up there: it
    matches no run and the lookup would walk the whole backlog."""
    backlog, limit = 5000, 5
    conn = connect(pg_url)
    try:
        _seed(conn, backlog)
        plan = explain_claim(pg_url, conn, limit, [TARGET])
        # The probe (10 x limit), the window (2 x limit), the locking step: a few
        # hundred rows at most, never the backlog.
        assert rows_read(plan) < backlog // 5, json.dumps(plan)[:4000]
    finally:
        conn.rollback()
        conn.close()


def test_a_claim_behind_three_concurrent_claimers_does_not_rank_the_backlog(
    pg_url: str,
) -> None:
    """Three workers claiming from one big tenant at once hold its first 3 x limit due
    runs: more than the claim's first window (2 x limit). The next claim takes the
    runs after them from a wider window, without ranking the whole backlog."""
    backlog, limit = 5000, 5
    conn, holder = connect(pg_url), connect(pg_url)
    try:
        _seed(conn, backlog)
        held = [f"r{i:05d}" for i in range(3 * limit)]
        holder.execute("SELECT id FROM runs WHERE id = ANY(%s) FOR UPDATE", (held,))
        plan = explain_claim(pg_url, conn, limit, [TARGET])
        assert plan["Actual Rows"] == limit  # a full claim, past the held rows
        assert rows_read(plan) < backlog // 5, json.dumps(plan)[:4000]
    finally:
        holder.rollback()
        holder.close()
        conn.rollback()
        conn.close()


def test_nothing_past_the_first_window_runs_when_it_fills_the_claim(pg_url: str) -> None:
    """Nothing held: the first window fills the claim, and neither the wide window nor
    the whole backlog is read. Held past it, the wide window fills it and the
    backlog is still not ranked."""
    backlog, limit = 5000, 5
    conn, holder = connect(pg_url), connect(pg_url)
    try:
        _seed(conn, backlog)
        found = ctes(explain_claim(pg_url, conn, limit, [TARGET]))
        assert found["near"] == 1
        assert found.get("mid", 0) == 0 and found.get("far", 0) == 0, found
        assert found.get("wide", 0) == 0, found
        holder.execute("SELECT id FROM runs WHERE id = ANY(%s) FOR UPDATE",
                       ([f"r{i:05d}" for i in range(3 * limit)],))  # fmt: skip
        plan = explain_claim(pg_url, conn, limit, [TARGET])
        found = ctes(plan)
        assert plan["Actual Rows"] == limit
        assert found["mid"] == 1 and found.get("far", 0) == 0, found
    finally:
        holder.rollback()
        holder.close()
        conn.rollback()
        conn.close()


def test_runs_the_wide_window_could_take_past_the_claims_limit_stay_queued(
    pg_url: str,
) -> None:
    """The first window takes 2 of a claim of 5 (the rest of it held); the wide window
    has many more: the claim takes 3 of them, and after it commits only those 5 are
    running; the others are still queued and claimable."""
    backlog, limit = 400, 5
    conn, holder, claimer = connect(pg_url), connect(pg_url), connect(pg_url)
    try:
        _seed(conn, backlog)
        held = [f"r{i:05d}" for i in range(2 * limit) if i not in (3, 7)]
        holder.execute("SELECT id FROM runs WHERE id = ANY(%s) FOR UPDATE", (held,))
        sql = convert_placeholders(PostgresDialect(pg_url).claim_sql(1))
        got = [r["id"] for r in claimer.execute(sql, claim_params("w", limit, [TARGET]))]
        claimer.commit()
        assert sorted(got) == ["r00003", "r00007", "r00010", "r00011", "r00012"]
        running = conn.execute("SELECT id FROM runs WHERE status = 'running' ORDER BY id")
        assert [r["id"] for r in running.fetchall()] == sorted(got)
        conn.rollback()
        # Nothing but the claim's own runs is left locked by it.
        free = conn.execute("SELECT COUNT(*) AS n FROM (SELECT id FROM runs WHERE status = "
                            "'queued' FOR UPDATE SKIP LOCKED) s").fetchone()  # fmt: skip
        assert free is not None and free["n"] == backlog - limit - len(held)
    finally:
        holder.rollback()
        holder.close()
        claimer.rollback()
        claimer.close()
        conn.rollback()
        conn.close()


def test_many_tenants_are_not_walked_when_the_oldest_due_runs_fill_the_claim(
    pg_url: str,
) -> None:
    """5,000 tenants with one due run each: the oldest 10 x limit due runs already hold
    more tenants' first runs than the claim takes, and the fair order starts with them,
    so the claim reads those, not one index seek per tenant."""
    backlog, limit = 5000, 5
    conn = connect(pg_url)
    try:
        _seed(conn, backlog, tenants=backlog)
        plan = explain_claim(pg_url, conn, limit, [TARGET])
        assert plan["Actual Rows"] == limit
        assert rows_read(plan) < backlog // 5, json.dumps(plan)[:4000]
    finally:
        conn.rollback()
        conn.close()
