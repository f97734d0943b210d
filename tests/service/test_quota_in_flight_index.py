"""The in-flight quota count reads the ``runs_live`` partial index (unfinished runs only),
not the tenant's whole history, and counts exactly the unfinished runs."""

from __future__ import annotations

from agentledger.records import RunStatus
from agentledger.service._queries.quota import LIVE, Quota, QuotaBook, in_flight_sql
from agentledger.store import Store
from agentledger.store._base import NewRun
from agentledger.store._queries.runs import create_run
from agentledger.store._tx import Tx

HISTORY = 300  # finished runs of the tenant
LIVE_RUNS = {"queued": 4, "running": 3, "waiting": 2}


def _fill(tx: Tx) -> None:
    for i in range(HISTORY):
        create_run(tx, NewRun("workflow", "w", "1", {}, tenant_id="hist", request_id=f"h{i}"))
    terminal = sorted(RunStatus.TERMINAL)
    tx.execute("UPDATE runs SET status = :s", {"s": terminal[0]})
    for j, status in enumerate(terminal):  # every terminal status, none counted
        tx.execute("UPDATE runs SET status = :s WHERE request_id = :r", {"s": status, "r": f"h{j}"})
    for status, n in LIVE_RUNS.items():
        for _ in range(n):
            run = create_run(tx, NewRun("workflow", "w", "1", {}, tenant_id="hist"))
            sql = "UPDATE runs SET status = :s WHERE id = :id"
            tx.execute(sql, {"s": status, "id": run.id})
    for _ in range(50):  # another tenant's runs in flight are not counted
        create_run(tx, NewRun("workflow", "w", "1", {}, tenant_id="other"))
    if tx.dialect.name == "postgres":
        tx.execute("ANALYZE runs")  # what autovacuum does for a real table


def _plan(tx: Tx) -> str:
    sql = in_flight_sql(tx.dialect)
    if tx.dialect.name == "sqlite":
        rows = tx.fetchall("EXPLAIN QUERY PLAN " + sql, {"t": "hist"})
        return " ".join(str(r["detail"]) for r in rows)
    # A table this small is cheapest to read whole; what is asked here is which index
    # the planner prefers, the tenant's (its history) or runs_live (its runs in flight).
    tx.execute("SET LOCAL enable_seqscan = off")
    rows = tx.fetchall("EXPLAIN " + sql, {"t": "hist"})
    return " ".join(str(r["QUERY PLAN"]) for r in rows)


def _count(tx: Tx) -> int:
    book = QuotaBook(Quota(max_in_flight=1000), now=0.0)
    book.prepare(tx, ["hist"])
    tally = book._tallies["hist"]
    assert tally is not None
    return tally.in_flight


def test_live_statuses_are_the_unfinished_ones() -> None:
    unfinished = [s for s in RunStatus.ALL if s not in RunStatus.TERMINAL]
    expected = "status IN (" + ", ".join(f"'{s}'" for s in unfinished) + ")"
    assert expected == LIVE


async def test_in_flight_count_uses_runs_live(store: Store) -> None:
    await store.transact(_fill)
    plan = await store.read(_plan)
    assert "runs_live" in plan, plan
    assert await store.transact(_count) == sum(LIVE_RUNS.values())
