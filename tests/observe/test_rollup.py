"""The daily rollup (store/_queries/rollup.py) gives the figures a direct computation
over the runs gives, on SQLite and PostgreSQL: before, during and after folding, after a
prune removed the runs, with runs finishing and folding in two processes at once, and
after a fold killed between any two of its statements (issue 23 point 8, issue 25
point 5)."""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentledger import _rollup
from agentledger.observe._numbers import numbers
from agentledger.observe._queries import stats as observe_stats
from agentledger.observe._queries.metrics import snapshot
from agentledger.observe._queries.resume import resume_run
from agentledger.store import Store
from agentledger.store._queries import rollup
from agentledger.worker import Worker, WorkerConfig
from tests.service import service_app
from tests.store.test_prune import KEY, _finished, run_cli

CHILD = str(Path(__file__).with_name("rollup_child.py"))
DAY = 86400


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_AUDIT_KEY", KEY)


async def _sql(store: Store, sql: str, params: dict[str, Any] | None = None) -> Any:
    return await store.transact(lambda tx: tx.fetchall(sql, params or {}))


async def _direct(store: Store, since_day: int | None) -> dict[str, Any]:
    """The figures computed over the runs themselves (observe_stats: exact percentiles),
    and the settled history as the scan before the rollup read it."""
    since = None if since_day is None else since_day * DAY
    raw = await store.read(observe_stats.run_stats, since, None, "t1")
    targets = await store.read(observe_stats.by_target, since, None, "t1")
    daily = await store.read(observe_stats.by_target, since, None, "t1", None, True)
    return {"raw": raw, "targets": targets, "daily": daily, "settled": await _settled(store)}


async def _settled(store: Store) -> dict[str, Any]:
    runs = await store.read(
        lambda tx: tx.fetchall(
            "SELECT status, name, version, tenant_id, usage_simulated, COUNT(*) AS n, "
            "SUM(tokens) AS tokens, SUM(cost_usd) AS cost, SUM(resumes) AS resumes FROM runs "
            "WHERE status NOT IN ('queued', 'running', 'waiting') "
            "GROUP BY status, name, version, tenant_id, usage_simulated"
        )
    )
    outbox = await store.read(
        lambda tx: tx.fetchall(
            "SELECT status, COUNT(*) AS n FROM outbox WHERE status NOT IN ('pending', 'dead') "
            "GROUP BY status"
        )
    )
    return {"runs": _rows(runs), "outbox": {r["status"]: int(r["n"]) for r in outbox}}


def _rows(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {
        (r["status"], r["name"], r["version"], r["tenant_id"], int(r["usage_simulated"])): (
            int(r["n"]), int(r["tokens"] or 0), round(float(r["cost"] or 0), 6),
            int(r["resumes"] or 0),
        )
        for r in rows
    }  # fmt: skip


def _same_bucket(got: float | None, exact: float | None) -> bool:
    if exact is None:
        return got is None
    return got is not None and rollup.bucket_of(got) == rollup.bucket_of(exact)


async def _check(store: Store, since_day: int | None, want: dict[str, Any]) -> None:
    """The rollup's figures are the direct ones ``want``."""
    got = await numbers(store, "t1", since_day)
    o, raw = got["overall"], want["raw"]
    assert o["by_status"] == raw["by_status"]
    assert o["runs"] == raw["runs"] and o["tokens"] == raw["tokens"]
    assert math.isclose(o["cost_usd"], raw["cost_usd"], abs_tol=1e-9)
    # The exact nearest-rank value is in the bucket the rollup reports, so within its
    # precision of it.
    done = [g for g in want["targets"] if g["completed"]]
    assert done, "the seed has completed runs"
    for name, key in (("p50_seconds", "p50"), ("p95_seconds", "p95")):
        assert _same_bucket(o[name], raw["duration"][key]), (name, o[name], raw["duration"])
        if raw["duration"][key]:
            assert abs(o[name] / raw["duration"][key] - 1) <= rollup.PRECISION + 1e-12
    failing = {(f["step"], f["error_class"]): f for f in raw["failing_steps"]}
    assert {(f["step"], f["error_class"]) for f in o["failing_steps"]} == set(failing)
    for f in o["failing_steps"]:
        exact = failing[(f["step"], f["error_class"])]
        assert f["failures"] == exact["failures"]
        assert math.isclose(f["cost_usd"], exact["cost_usd"], abs_tol=1e-9)
        assert math.isclose(f["avg_seconds"], exact["avg_seconds"], rel_tol=1e-9)
    for mine, theirs in ((got["targets"], want["targets"]), (got["series"], want["daily"])):
        assert len(mine) == len(theirs)
        by_key = {(g["agent"], g["version"], g.get("day")): g for g in mine}
        for g in theirs:
            m = by_key[(g["agent"], g["version"], g["day"])]
            for k in ("runs", "completed", "finished"):
                assert m[k] == g[k], (k, m, g)
            assert math.isclose(m["cost_usd"], g["cost_usd"], abs_tol=1e-9)
            assert _same_bucket(m["p50_seconds"], g["p50_seconds"])
            assert _same_bucket(m["p95_seconds"], g["p95_seconds"])
    settled = await store.read(snapshot, live=False, settled=True)
    assert _rows(settled["settled_runs"]) == want["settled"]["runs"]
    outbox = {r["status"]: int(r["n"]) for r in settled["settled_outbox"]}
    assert outbox == want["settled"]["outbox"]


async def _seed(store: Store) -> int:
    """Real runs (a worker ran them, their events sealed), then rewritten as a month of
    history: statuses, days, durations, costs, failing steps; outbox rows. The first
    day of the window."""
    ids = await _finished(store, "t1", 36, steps=2)
    ids += await _finished(store, "t2", 3, steps=1)  # another tenant's
    assert not await _sql(store, "SELECT * FROM rollup_runs")  # nothing folded yet
    rng = random.Random(23)
    now = time.time()
    today = int(now // DAY)
    for i, run_id in enumerate(ids):
        status = rng.choice(["completed"] * 5 + ["failed", "needs_human", "cancelled", "expired"])
        created = (today - rng.randrange(0, 30)) * DAY + rng.uniform(0, 3600)
        duration = rng.choice([0.0004, rng.uniform(0.01, 2), rng.uniform(2, 400)])
        await _sql(
            store,
            "UPDATE runs SET status = :s, created_at = :c, updated_at = :u, cost_usd = :cost, "
            "tokens = :t, version = :v, usage_simulated = :sim, resumes = :res, "
            "handover_reason = :h WHERE id = :id",
            {"s": status, "c": created, "u": created + duration, "cost": rng.uniform(0, 0.3),
             "t": i * 7, "v": str(1 + i % 2), "sim": int(i % 5 == 0), "res": i % 3,
             "h": "budget" if status == "needs_human" else None, "id": run_id},
        )  # fmt: skip
        if status in ("failed", "needs_human") and i % 3:
            await _sql(
                store,
                "UPDATE steps SET status = 'failed', error_class = :e WHERE run_id = :r "
                "AND step_no = :n",
                {"e": rng.choice(["ToolError", "Timeout", None]), "r": run_id, "n": 1 + i % 2},
            )
        await _sql(
            store,
            "INSERT INTO outbox (key, run_id, step_no, tool, attempts, next_attempt_at, "
            "status, created_at, updated_at) VALUES (:k, :r, 1, 'email', 1, 0, :s, 0, 0)",
            {"k": f"ob-{i}", "r": run_id, "s": ("delivered", "delivered", "dead")[i % 3]},
        )
    return today - 6


async def test_the_rollup_is_the_runs_before_during_and_after_folding_and_a_prune(
    keyed: None, store: Store, store_url: str
) -> None:
    week = await _seed(store)
    # A run in flight is read live, in its window, whatever is folded.
    await _finished(store, "t1", 1)
    want = {since: await _direct(store, since) for since in (week, None)}
    for since in (week, None):
        await _check(store, since, want[since])
    assert await store.transact(rollup.fold_pending, 4) > 0  # a part folded
    for since in (week, None):
        await _check(store, since, want[since])
    await _rollup.fold_once(store, max_batches=None)
    left = await _sql(
        store,
        "SELECT COUNT(*) AS n FROM runs WHERE rolled = 0 AND status IN "
        "('completed', 'cancelled', 'expired')",
    )
    assert int(left[0]["n"]) == 0
    for since in (week, None):
        await _check(store, since, want[since])
    # A folded failed run resumed, and a folded handed-over run resumed from a step it
    # keeps (its failing step changes): each leaves the rollup as it was folded, read
    # live, then folded again as it is.
    folded = (
        "SELECT id FROM runs WHERE status = :s AND tenant_id = 't1' AND rolled = 1 "
        "AND version = '1' ORDER BY id"
    )
    failed = await _sql(store, folded, {"s": "failed"})
    handed = await _sql(store, folded, {"s": "needs_human"})
    assert failed and handed
    await store.transact(resume_run, failed[0]["id"], 1, "ops", "retry")
    await store.transact(resume_run, handed[0]["id"], None, "ops", "retry")
    want = {since: await _direct(store, since) for since in (week, None)}
    for since in (week, None):
        await _check(store, since, want[since])
    assert {r["rolled"] for r in await _sql(
        store, "SELECT rolled FROM runs WHERE id IN (:a, :b)",
        {"a": failed[0]["id"], "b": handed[0]["id"]})} == {0}  # fmt: skip
    await _rollup.fold_once(store, max_batches=None)
    for since in (week, None):
        await _check(store, since, want[since])
    await Worker(store, service_app.app, WorkerConfig(poll_seconds=0.02), burst=True).run(
        install_signals=False
    )  # the resumed runs run again, to their end
    assert {r["status"] for r in await _sql(
        store, "SELECT status FROM runs WHERE id IN (:a, :b)",
        {"a": failed[0]["id"], "b": handed[0]["id"]})} == {"completed"}  # fmt: skip
    want = {since: await _direct(store, since) for since in (week, None)}
    for since in (week, None):
        await _check(store, since, want[since])
    await _rollup.fold_once(store, max_batches=None)
    for since in (week, None):
        await _check(store, since, want[since])
    # The prune removes the runs (every finished one, failed and handed over too, with
    # their delivered outbox rows); the numbers stay.
    every = "completed,failed,cancelled,expired,needs_human"
    got = await run_cli("prune", "--older-than", "0s", "--status", every, "--db", store_url)
    assert got.exit_code == 0, got.output
    kept = await _sql(store, "SELECT COUNT(*) AS n FROM runs WHERE tenant_id = 't1'")
    assert int(kept[0]["n"]) <= 2, got.output  # what the prefix rule may keep
    for since in (week, None):
        await _check(store, since, want[since])


async def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILD, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=dict(os.environ),
    )  # fmt: skip


async def test_runs_finishing_and_folding_in_two_processes_are_counted_once(
    store: Store, store_url: str
) -> None:
    children = [await _child("finish", store_url, tag, "40", "fold") for tag in ("a", "b")]
    while any(c.poll() is None for c in children):  # this process folds meanwhile
        await store.transact(rollup.fold_pending, 3)
        await asyncio.sleep(0.01)
    for c in children:
        c.communicate()
    assert [c.returncode for c in children] == [0, 0]
    await _rollup.fold_once(store, max_batches=None)
    folded = await _sql(store, "SELECT SUM(runs) AS n, SUM(cost_usd) AS c FROM rollup_runs")
    direct = await _sql(store, "SELECT COUNT(*) AS n, SUM(cost_usd) AS c FROM runs")
    assert int(folded[0]["n"]) == int(direct[0]["n"]) == 80
    assert math.isclose(float(folded[0]["c"]), float(direct[0]["c"]), abs_tol=1e-9)
    completed = await _sql(store, "SELECT SUM(runs) AS n FROM rollup_durations")
    assert int(completed[0]["n"]) == 80 - 2 * 6  # i % 7 == 3 of range(40): cancelled
    await _check(store, None, await _direct_all_tenants(store))


async def _direct_all_tenants(store: Store) -> dict[str, Any]:
    await _sql(store, "UPDATE runs SET tenant_id = 't1'")  # one tenant: the page's scope
    await _sql(store, "UPDATE rollup_runs SET tenant_id = 't1'")
    await _sql(store, "UPDATE rollup_durations SET tenant_id = 't1'")
    return await _direct(store, None)


async def test_a_fold_killed_between_any_two_statements_counts_nothing_twice(
    store: Store, store_url: str
) -> None:
    await _child_finish(store_url)
    # How many statements one fold transaction runs here (the outbox is empty).
    whole = await _child("fold", store_url, "0")
    out, _ = await asyncio.to_thread(whole.communicate, "")
    steps = [line for line in out.splitlines() if line.startswith("at ")]
    assert out.splitlines()[-1] == "done 5" and len(steps) >= 3
    for stop_at in range(1, len(steps) + 1):
        child = await _child("fold", store_url, str(stop_at))
        try:
            assert child.stdout is not None
            line = ""
            while line != f"at {stop_at}":
                line = (await asyncio.to_thread(child.stdout.readline)).strip()
                assert line, "the fold ended before the statement it was to stop at"
        finally:
            child.send_signal(signal.SIGKILL)
            await asyncio.to_thread(child.communicate)
        await _killed_transaction_gone(store, store_url)
    await _rollup.fold_once(store, max_batches=None)
    await _check(store, None, await _direct_all_tenants(store))


async def _killed_transaction_gone(store: Store, store_url: str) -> None:
    """Wait until the killed child's transaction is rolled back. PostgreSQL ends its
    backend only when it notices the closed socket; until then the rows it picked stay
    locked and the next fold skips them (SKIP LOCKED) and runs fewer statements. SQLite's
    locks go with the process."""
    if not store_url.startswith("postgres"):
        return
    for _ in range(1200):
        rows = await _sql(
            store,
            "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
        )
        if int(rows[0]["n"]) == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the killed fold's transaction is still open after 60 s")


async def _child_finish(store_url: str) -> None:
    child = await _child("finish", store_url, "k", "30", "nofold")
    await asyncio.to_thread(child.communicate, "")
    assert child.returncode == 0


def test_a_bucket_holds_its_lower_edge_and_reports_within_the_precision() -> None:
    assert rollup.bucket_of(0.0) == rollup.bucket_of(-1.0) == rollup.bucket_of(0.0009) == 0
    for i in range(1, 260):
        low, high = rollup.bucket_floor(i), rollup.bucket_floor(i + 1)
        assert rollup.bucket_of(low) == i and rollup.bucket_of(high) == i + 1
        assert rollup.bucket_of(math.nextafter(high, 0)) == i
        middle = rollup.bucket_value(i)
        assert rollup.bucket_of(middle) == i
        for exact in (low, math.nextafter(high, 0)):
            assert abs(middle / exact - 1) <= rollup.PRECISION + 1e-12
