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
