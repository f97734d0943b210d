"""The five numbers on a seeded store match what the test computes from the rows, on
SQLite and PostgreSQL (issue 11, item 3)."""

from __future__ import annotations

import math
import random
import time
from typing import Any

from agentledger.observe._stats import stats
from agentledger.observe._stuck import StuckPolicy
from agentledger.store._base import NewRun
from agentledger.store._sqlstore import Store


async def _sql(store: Store, sql: str, params: dict[str, Any]) -> None:
    await store._call(lambda tx: tx.execute(sql, params))


def _nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


async def test_stats_match_the_rows(store: Store) -> None:
    rng = random.Random(11)
    now = time.time()
    rows = []
    for i in range(40):
        name = "booking" if i % 4 else "refund"
        status = rng.choice(["completed"] * 6 + ["failed", "needs_human", "cancelled", "running"])
        age = rng.uniform(0, 5 * 86400) if i % 10 else 20 * 86400  # some outside 7 d
        duration = round(rng.uniform(1, 300), 3)
        cost = round(rng.uniform(0, 0.5), 4)
        run = await store.create_run(NewRun("workflow", name, "1", {"i": i}))
        await _sql(
            store,
            "UPDATE runs SET status = :s, created_at = :c, updated_at = :u, cost_usd = :cost, "
            "tokens = :t WHERE id = :id",
            {"s": status, "c": now - age, "u": now - age + duration, "cost": cost,
             "t": i * 10, "id": run.id},
        )  # fmt: skip
        failing = None
        if status in ("failed", "needs_human"):
            failing = rng.choice(["pay", "book", None])
            for no, (step, st) in enumerate(
                [
                    ("search", "succeeded"),
                    (failing or "confirm", "failed" if failing else "succeeded"),
                ],
                start=1,
            ):
                await _sql(
                    store,
                    "INSERT INTO steps (run_id, step_no, kind, name, status, lease_epoch) "
                    "VALUES (:r, :n, 'tool', :name, :st, 1)",
                    {"r": run.id, "n": no, "name": step, "st": st},
                )
        rows.append(dict(name=name, status=status, age=age, duration=duration, cost=cost,
                         tokens=i * 10, failing=failing))  # fmt: skip
    for since, agent in ((7 * 86400.0, None), (None, "booking")):
        got = await stats(store, since, agent, StuckPolicy(after=10 * 365 * 86400))
        mine = [
            r for r in rows
            if (since is None or r["age"] <= since - 5) and agent in (None, r["name"])
        ]  # fmt: skip
        assert got.runs == len(mine)
        finished = [r for r in mine if r["status"] != "running"]
        done = [r for r in mine if r["status"] == "completed"]
        assert math.isclose(got.completion_rate or 0, len(done) / len(finished))
        durations = [r["duration"] for r in done]
        assert math.isclose(got.p50_seconds or 0, _nearest_rank(durations, 0.5), abs_tol=1e-3)
        assert math.isclose(got.p95_seconds or 0, _nearest_rank(durations, 0.95), abs_tol=1e-3)
        assert math.isclose(got.cost_per_run_usd or 0, sum(r["cost"] for r in mine) / len(mine))
        assert got.tokens == sum(r["tokens"] for r in mine)
        expected: dict[str, list[dict[str, Any]]] = {}
        for r in mine:
            if r["status"] in ("failed", "needs_human"):
                expected.setdefault(r["failing"] or "(no step)", []).append(r)
        table = {f["step"]: f for f in got.failing_steps}
        assert set(table) == set(expected)
        for step, runs in expected.items():
            assert table[step]["failures"] == len(runs)
            avg_cost = sum(r["cost"] for r in runs) / len(runs)
            assert math.isclose(table[step]["avg_cost_usd"], avg_cost, abs_tol=1e-9)
            assert math.isclose(
                table[step]["avg_seconds"],
                sum(r["duration"] for r in runs) / len(runs),
                abs_tol=1e-3,
            )
        assert got.stuck == []


async def test_numbers_per_agent_version_and_day_match_the_rows(store: Store) -> None:
    """by_target's counts, cost and nearest-rank p50/p95 per agent, version and UTC day
    (and over the window without days) are what the rows say; failing steps carry
    their class and total cost; ``version`` narrows the five numbers."""
    from agentledger.observe._queries.stats import by_target

    rng = random.Random(23)
    midnight = (int(time.time() // 86400) - 3) * 86400.0
    rows = []
    for i in range(60):
        name, version = ("booking", str(1 + i % 2)) if i % 3 else ("refund", "1")
        status = rng.choice(["completed"] * 5 + ["failed", "running"])
        created = midnight + rng.choice([-0.5, 0.5, 86400.5, 2 * 86400 + 7])
        duration = round(rng.uniform(1, 100), 3)
        cost = round(rng.uniform(0, 0.5), 4)
        run = await store.create_run(NewRun("workflow", name, version, {"i": i}))
        await _sql(
            store,
            "UPDATE runs SET status = :s, created_at = :c, updated_at = :u, cost_usd = :cost, "
            "handover_reason = :why WHERE id = :id",
            {"s": status, "c": created, "u": created + duration, "cost": cost, "id": run.id,
             "why": "rate_limited" if status == "failed" else None},
        )  # fmt: skip
        rows.append(dict(name=name, version=version, status=status, day=int(created // 86400),
                         duration=duration, cost=cost))  # fmt: skip
    for per_day in (True, False):
        got = await store.read(by_target, midnight - 86400, None, None, None, per_day)
        expected: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}
        for r in rows:
            key = (r["name"], r["version"], r["day"] if per_day else None)
            expected.setdefault(key, []).append(r)
        assert {(g["agent"], g["version"], g["day"]) for g in got} == set(expected)
        assert per_day is False or len({g["day"] for g in got}) == 4  # midnight splits
        for g in got:
            mine = expected[(g["agent"], g["version"], g["day"])]
            done = [r["duration"] for r in mine if r["status"] == "completed"]
            assert g["runs"] == len(mine)
            assert g["completed"] == len(done)
            assert g["finished"] == sum(r["status"] != "running" for r in mine)
            assert math.isclose(g["cost_usd"], sum(r["cost"] for r in mine), abs_tol=1e-9)
            for name, p in (("p50_seconds", 0.5), ("p95_seconds", 0.95)):
                want = _nearest_rank(done, p) if done else None
                assert (g[name] is None) == (want is None)
                assert want is None or math.isclose(g[name], want, abs_tol=1e-3)
    two = await stats(store, None, "booking", StuckPolicy(after=10 * 365 * 86400), version="2",
                      bucket="day")  # fmt: skip
    mine = [r for r in rows if r["name"] == "booking" and r["version"] == "2"]
    assert two.runs == len(mine) and two.series is not None
    assert {(g["agent"], g["version"]) for g in two.series} == {("booking", "2")}
    failed = [r for r in mine if r["status"] == "failed"]
    assert [(f["step"], f["error_class"], f["failures"]) for f in two.failing_steps] == (
        [("(no step)", "rate_limited", len(failed))] if failed else []
    )
    if failed:
        total = sum(r["cost"] for r in failed)
        assert math.isclose(two.failing_steps[0]["cost_usd"], total, abs_tol=1e-9)
