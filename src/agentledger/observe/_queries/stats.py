"""The five numbers, in SQL that runs on SQLite and PostgreSQL alike.

Window: runs created at or after ``since`` (UNIX seconds), optionally of one agent or
workflow. A run's duration is from its submit to its last update (its end, for a
finished run). Percentiles are nearest-rank (the value at rank ceil(p * n)), read with
ORDER BY ... LIMIT 1 OFFSET k so both databases compute the same figure.
"""

from __future__ import annotations

import math
from typing import Any

from agentledger.store._tx import Tx


def _where(
    since: float | None, agent: str | None, tenant: str | None, alias: str = ""
) -> tuple[str, dict[str, Any]]:
    prefix = f"{alias}." if alias else ""
    clauses: list[str] = ["1 = 1"]
    params: dict[str, Any] = {}
    if since is not None:
        clauses.append(f"{prefix}created_at >= :since")
        params["since"] = float(since)
    if agent is not None:
        clauses.append(f"{prefix}name = :agent")
        params["agent"] = agent
    if tenant is not None:
        clauses.append(f"{prefix}tenant_id = :tenant")
        params["tenant"] = tenant
    return " AND ".join(clauses), params


def nearest_rank(n: int, p: float) -> int:
    """The 0-based offset of the p-th percentile among n sorted values."""
    return max(0, min(n - 1, math.ceil(p * n) - 1))


def run_stats(
    tx: Tx, since: float | None, agent: str | None, tenant: str | None = None
) -> dict[str, Any]:
    """Counts by status, totals, duration percentiles and the failing-step distribution
    (of one tenant's runs, or every tenant's)."""
    where, params = _where(since, agent, tenant)
    by_status = {
        r["status"]: int(r["n"])
        for r in tx.fetchall(
            f"SELECT status, COUNT(*) AS n FROM runs WHERE {where} GROUP BY status", params
        )
    }
    totals = tx.fetchall(
        "SELECT COUNT(*) AS n, COALESCE(SUM(cost_usd), 0) AS cost, "
        "COALESCE(SUM(tokens), 0) AS tokens, COALESCE(SUM(usage_simulated), 0) AS simulated "
        f"FROM runs WHERE {where}",
        params,
    )[0]
    done = f"{where} AND status = 'completed'"
    n_done = by_status.get("completed", 0)
    percentiles: dict[str, float | None] = {"p50": None, "p95": None}
    for name, p in (("p50", 0.5), ("p95", 0.95)):
        if n_done:
            row = tx.fetchall(
                f"SELECT updated_at - created_at AS seconds FROM runs WHERE {done} "
                "ORDER BY updated_at - created_at, id LIMIT 1 OFFSET :k",
                {**params, "k": nearest_rank(n_done, p)},
            )
            percentiles[name] = float(row[0]["seconds"])
    rwhere, rparams = _where(since, agent, tenant, "r")
    # The failing step of a run: its first failed or unsettled step (compensations and
    # the compensation decision aside); a run without one failed outside any step.
    failing = tx.fetchall(
        "SELECT COALESCE(s.name, '(no step)') AS step, COUNT(*) AS n, "
        "AVG(r.cost_usd) AS cost, AVG(r.updated_at - r.created_at) AS seconds "
        "FROM runs r LEFT JOIN steps s ON s.run_id = r.id AND s.step_no = ("
        "SELECT MIN(x.step_no) FROM steps x WHERE x.run_id = r.id "
        "AND x.status IN ('failed', 'unknown', 'started', 'retrying') "
        "AND x.kind NOT IN ('compensation', 'decision')) "
        f"WHERE {rwhere} AND r.status IN ('failed', 'needs_human') "
        "GROUP BY COALESCE(s.name, '(no step)') ORDER BY n DESC, step",
        rparams,
    )
    return {
        "by_status": by_status,
        "runs": int(totals["n"]),
        "cost_usd": float(totals["cost"]),
        "tokens": int(totals["tokens"]),
        "simulated_runs": int(totals["simulated"]),
        "duration": percentiles,
        "failing_steps": [
            {
                "step": r["step"],
                "failures": int(r["n"]),
                "avg_cost_usd": float(r["cost"] or 0.0),
                "avg_seconds": float(r["seconds"] or 0.0),
            }
            for r in failing
        ],
    }
