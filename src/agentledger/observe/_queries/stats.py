"""The five numbers, in SQL that runs on SQLite and PostgreSQL alike.

Window: runs created at or after ``since`` (UNIX seconds), optionally of one agent or
workflow. A run's duration is from its submit to its last update (its end, for a
finished run). Percentiles are nearest-rank (the value at rank ceil(p * n)), read with
ORDER BY ... LIMIT 1 OFFSET k so both databases compute the same figure.
"""

from __future__ import annotations

import math
from typing import Any

from agentledger.store._queries import rollup
from agentledger.store._tx import Tx


def _where(
    since: float | None,
    agent: str | None,
    tenant: str | None,
    alias: str = "",
    version: str | None = None,
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
    if version is not None:
        clauses.append(f"{prefix}version = :version")
        params["version"] = version
    if tenant is not None:
        clauses.append(f"{prefix}tenant_id = :tenant")
        params["tenant"] = tenant
    return " AND ".join(clauses), params


def nearest_rank(n: int, p: float) -> int:
    """The 0-based offset of the p-th percentile among n sorted values."""
    return max(0, min(n - 1, math.ceil(p * n) - 1))


def run_stats(
    tx: Tx,
    since: float | None,
    agent: str | None,
    tenant: str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Counts by status, totals, duration percentiles and the failing-step distribution
    by step and failure class (of one tenant's runs, or every tenant's; of one version
    of the agent when ``version`` is given)."""
    where, params = _where(since, agent, tenant, version=version)
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
    rwhere, rparams = _where(since, agent, tenant, "r", version)
    join, cls = rollup.failing_sql("r")
    failing = tx.fetchall(
        f"SELECT COALESCE(s.name, '(no step)') AS step, {cls} AS error_class, "
        "COUNT(*) AS n, SUM(r.cost_usd) AS total, "
        "AVG(r.cost_usd) AS cost, AVG(r.updated_at - r.created_at) AS seconds "
        f"FROM runs r {join} "
        f"WHERE {rwhere} AND r.status IN ('failed', 'needs_human') "
        f"GROUP BY COALESCE(s.name, '(no step)'), {cls} ORDER BY n DESC, step, error_class",
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
                "error_class": r["error_class"] or None,
                "failures": int(r["n"]),
                "cost_usd": float(r["total"] or 0.0),
                "avg_cost_usd": float(r["cost"] or 0.0),
                "avg_seconds": float(r["seconds"] or 0.0),
            }
            for r in failing
        ],
    }


#: Statuses a run ends in (the completion rate's denominator).
_FINISHED = ("completed", "failed", "cancelled", "expired", "needs_human")


def _day(tx: Tx, column: str) -> str:
    return rollup.day_sql(tx, column)


def by_target(
    tx: Tx,
    since: float | None,
    agent: str | None,
    tenant: str | None,
    version: str | None = None,
    per_day: bool = False,
    percentiles: bool = True,
) -> list[dict[str, Any]]:
    """The numbers per agent and version (and per UTC day of creation when ``per_day``):
    runs, completed, finished, cost, and p50/p95 duration of the completed runs
    (nearest rank, as :func:`run_stats`). Two grouped reads over the window's runs,
    whatever the number of agents, versions or days: a count per group, and one
    sorted pass over the completed runs numbered within their group, which returns
    only the rows at the ranks asked for (the costly part: left out, with p50/p95
    None, when ``percentiles`` is False)."""
    where, params = _where(since, agent, tenant, version=version)
    keys = "name, version" + (f", {_day(tx, 'created_at')}" if per_day else "")
    day = f"{_day(tx, 'created_at')} AS day" if per_day else "0 AS day"
    finished = ", ".join(f"'{s}'" for s in _FINISHED)
    counts = tx.fetchall(
        f"SELECT name, version, {day}, COUNT(*) AS n, "
        "SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END) AS completed, "
        f"SUM(CASE WHEN status IN ({finished}) THEN 1 ELSE 0 END) AS finished, "
        "COALESCE(SUM(cost_usd), 0) AS cost "
        f"FROM runs WHERE {where} GROUP BY {keys}",
        params,
    )
    # One sorted pass numbers the completed runs within their group; only the rows at
    # the group's nearest ranks come back: ceil(p * n) in integers, the same on both
    # backends, (n + 1) / 2 and (95n + 99) / 100, n from a count per group.
    ranks = []
    if percentiles:
        ranks = tx.fetchall(
            "SELECT ranked.name, ranked.version, ranked.day, ranked.secs, "
            "CASE WHEN ranked.rn = (c.cnt + 1) / 2 THEN 1 ELSE 0 END AS is50, "
            "CASE WHEN ranked.rn = (95 * c.cnt + 99) / 100 THEN 1 ELSE 0 END AS is95 FROM ("
            f"SELECT name, version, {day}, updated_at - created_at AS secs, ROW_NUMBER() "
            f"OVER (PARTITION BY {keys} ORDER BY updated_at - created_at) AS rn "
            f"FROM runs WHERE {where} AND status = 'completed') ranked JOIN ("
            f"SELECT name, version, {day}, COUNT(*) AS cnt FROM runs "
            f"WHERE {where} AND status = 'completed' GROUP BY {keys}) c "
            "ON c.name = ranked.name AND c.version = ranked.version AND c.day = ranked.day "
            "WHERE ranked.rn IN ((c.cnt + 1) / 2, (95 * c.cnt + 99) / 100)",
            params,
        )
    pct: dict[tuple[str, str, int], dict[str, float]] = {}
    for r in ranks:
        got = pct.setdefault((r["name"], r["version"], int(r["day"])), {})
        if r["is50"]:
            got["p50"] = float(r["secs"])
        if r["is95"]:
            got["p95"] = float(r["secs"])
    out = []
    for r in counts:
        key = (r["name"], r["version"], int(r["day"]))
        p: dict[str, float] = pct.get(key, {})
        out.append({
            "agent": r["name"], "version": r["version"], "day": key[2] if per_day else None,
            "runs": int(r["n"]), "completed": int(r["completed"] or 0),
            "finished": int(r["finished"] or 0), "cost_usd": float(r["cost"]),
            "p50_seconds": None if p.get("p50") is None else float(p["p50"]),
            "p95_seconds": None if p.get("p95") is None else float(p["p95"]),
        })  # fmt: skip
    out.sort(key=lambda g: (g["day"] or 0, g["agent"], g["version"]))
    return out
