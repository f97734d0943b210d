"""The five numbers over whole UTC days, read from the daily rollup (what the console's
numbers page shows): overall, per agent and version, and per agent, version and day.

Counts, costs and the failing steps are exact. p50/p95 come from the rollup's duration
buckets: the geometric middle of the bucket the exact nearest-rank value is in, within
:data:`~agentledger.store._queries.rollup.PRECISION` (6 %) of it.
"""

from __future__ import annotations

import math
from typing import Any

from agentledger.observe._queries import rollup as queries
from agentledger.observe._stats import FINISHED, with_rates
from agentledger.store._queries.rollup import bucket_value
from agentledger.store._sqlstore import Store
from agentledger.store._tx import Tx


def percentile(buckets: dict[int, int], p: float) -> float | None:
    """The p-th percentile (nearest rank, as ``/v1/stats``) of a duration histogram,
    as its bucket's reported figure; None when empty."""
    n = sum(buckets.values())
    if n <= 0:
        return None
    rank = max(1, min(n, math.ceil(p * n)))
    seen = 0
    for b in sorted(buckets):
        seen += buckets[b]
        if seen >= rank:
            return bucket_value(b)
    return None  # unreachable: the ranks are within n


def _read(tx: Tx, tenant: str | None, since_day: int | None) -> dict[str, Any]:
    return {
        "counts": queries.counts(tx, tenant, since_day),
        "durations": queries.durations(tx, tenant, since_day),
        "failing": queries.failing(tx, tenant, since_day),
    }


def _group(key: Any, acc: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    return acc.setdefault(key, {"runs": 0, "completed": 0, "finished": 0, "cost_usd": 0.0,
                                "buckets": {}})  # fmt: skip


def _figures(g: dict[str, Any]) -> dict[str, Any]:
    buckets = g.pop("buckets")
    g["p50_seconds"] = percentile(buckets, 0.5)
    g["p95_seconds"] = percentile(buckets, 0.95)
    return with_rates(g)


async def numbers(store: Store, tenant: str | None, since_day: int | None) -> dict[str, Any]:
    """The numbers of runs created on UTC day ``since_day`` (days since the epoch) or
    later (None: every day) of ``tenant`` (None: every tenant).

    ``overall``: ``runs``, ``by_status``, ``cost_usd``, ``tokens``, ``simulated_runs``,
    ``completion_rate``, ``p50_seconds``, ``p95_seconds``, ``cost_per_run_usd``,
    ``failing_steps``; ``targets``: per agent and version, and ``series``: per agent,
    version and day (``runs``, ``completed``, ``finished``, ``cost_usd``, p50/p95,
    rates); ``days``: per day and status, the runs and their cost."""
    raw = await store.read(_read, tenant, since_day)
    overall = _group(None, {})
    by_status: dict[str, int] = {}
    tokens = simulated = 0
    targets: dict[tuple[str, str], dict[str, Any]] = {}
    series: dict[tuple[str, str, int], dict[str, Any]] = {}
    days: dict[tuple[int, str], dict[str, Any]] = {}
    for r in raw["counts"]:
        status = r["status"]
        by_status[status] = by_status.get(status, 0) + r["runs"]
        tokens += r["tokens"]
        simulated += r["simulated"]
        for g in (overall, _group((r["agent"], r["version"]), targets),
                  _group((r["agent"], r["version"], r["day"]), series)):  # fmt: skip
            g["runs"] += r["runs"]
            g["cost_usd"] += r["cost_usd"]
            g["completed"] += r["runs"] if status == "completed" else 0
            g["finished"] += r["runs"] if status in FINISHED else 0
        d = days.setdefault((r["day"], status), {"day": r["day"], "status": status,
                                                 "runs": 0, "cost_usd": 0.0})  # fmt: skip
        d["runs"] += r["runs"]
        d["cost_usd"] += r["cost_usd"]
    for r in raw["durations"]:
        for g in (overall, _group((r["agent"], r["version"]), targets),
                  _group((r["agent"], r["version"], r["day"]), series)):  # fmt: skip
            g["buckets"][r["bucket"]] = g["buckets"].get(r["bucket"], 0) + r["runs"]
    failing: dict[tuple[str, str | None], dict[str, Any]] = {}
    for r in raw["failing"]:
        f = failing.setdefault((r["step"], r["error_class"]), {
            "step": r["step"], "error_class": r["error_class"], "failures": 0,
            "cost_usd": 0.0, "seconds": 0.0})  # fmt: skip
        f["failures"] += r["failures"]
        f["cost_usd"] += r["cost_usd"]
        f["seconds"] += r["seconds"]
    failing_steps = sorted(
        failing.values(), key=lambda f: (-f["failures"], f["step"], f["error_class"] or "")
    )
    for f in failing_steps:
        n = f["failures"]
        f["avg_cost_usd"] = f["cost_usd"] / n
        f["avg_seconds"] = f.pop("seconds") / n
    figures = _figures(overall)
    return {
        "overall": {
            **figures,
            "by_status": by_status,
            "tokens": tokens,
            "simulated_runs": simulated,
            "failing_steps": failing_steps,
        },
        "targets": [
            {"agent": k[0], "version": k[1], **_figures(g)} for k, g in sorted(targets.items())
        ],
        "series": [
            {"agent": k[0], "version": k[1], "day": k[2], **_figures(g)}
            for k, g in sorted(series.items())
        ],
        "days": [days[k] for k in sorted(days)],
    }
