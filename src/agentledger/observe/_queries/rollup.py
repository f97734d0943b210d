"""The numbers read from the daily rollup (store/_queries/rollup.py) plus the runs not
folded yet, in SQL that runs on SQLite and PostgreSQL alike.

Each read is one statement: the rollup's rows and the unfolded runs' (``rolled = 0``,
through the partial index ``runs_unrolled``) in one ``UNION ALL``, so one snapshot
sees every run exactly once, whether a fold commits meanwhile or not. Its cost follows
the rollup's rows in the window and the runs not folded (unfinished, failed or
``needs_human``, finished since the last fold), not the history.
"""

from __future__ import annotations

from typing import Any

from agentledger.store._queries import rollup
from agentledger.store._tx import Tx


def _window(tenant: str | None, since_day: int | None, alias: str = "") -> tuple[str, str]:
    """(the rollup rows' condition, the unfolded runs' condition)."""
    prefix = f"{alias}." if alias else ""
    folded, live = ["1 = 1"], [rollup.unfolded(alias)]
    if tenant is not None:
        folded.append("tenant_id = :tenant")
        live.append(f"{prefix}tenant_id = :tenant")
    if since_day is not None:
        folded.append("day >= :day")
        live.append(f"{prefix}created_at >= :since")
    return " AND ".join(folded), " AND ".join(live)


def _params(tenant: str | None, since_day: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if tenant is not None:
        params["tenant"] = tenant
    if since_day is not None:
        params["day"] = int(since_day)
        params["since"] = float(since_day) * 86400
    return params


def counts(tx: Tx, tenant: str | None, since_day: int | None) -> list[dict[str, Any]]:
    """Runs created on UTC day ``since_day`` or later (None: all) by agent, version, day
    and status, with their cost and tokens and how many a scripted model simulated."""
    folded, live = _window(tenant, since_day)
    day = rollup.day_sql(tx, "created_at")
    rows = tx.fetchall(
        "SELECT name, version, day, status, SUM(runs) AS n, SUM(cost_usd) AS cost, "
        "SUM(tokens) AS tokens, SUM(sim) AS simulated FROM ("
        "SELECT name, version, day, status, runs, cost_usd, tokens, "
        "CASE WHEN simulated = 1 THEN runs ELSE 0 END AS sim "
        f"FROM rollup_runs WHERE {folded} UNION ALL "
        f"SELECT name, version, {day} AS day, status, 1, cost_usd, tokens, "
        f"CASE WHEN usage_simulated = 1 THEN 1 ELSE 0 END FROM runs WHERE {live}"
        ") u GROUP BY name, version, day, status",
        _params(tenant, since_day),
    )
    return [
        {"agent": r["name"], "version": r["version"], "day": int(r["day"]),
         "status": r["status"], "runs": int(r["n"]), "cost_usd": float(r["cost"] or 0),
         "tokens": int(r["tokens"] or 0), "simulated": int(r["simulated"] or 0)}
        for r in rows
    ]  # fmt: skip


def durations(tx: Tx, tenant: str | None, since_day: int | None) -> list[dict[str, Any]]:
    """The completed runs' duration buckets by agent, version and day (the unfolded
    runs bucketed here, as the fold buckets them)."""
    folded, live = _window(tenant, since_day)
    day = rollup.day_sql(tx, "created_at")
    rows = tx.fetchall(
        "SELECT name, version, day, bucket, runs, NULL AS secs FROM rollup_durations "
        f"WHERE {folded} UNION ALL SELECT name, version, {day} AS day, NULL, 1, "
        f"updated_at - created_at FROM runs WHERE {live} AND status = 'completed'",
        _params(tenant, since_day),
    )
    out: dict[tuple[str, str, int, int], int] = {}
    for r in rows:
        b = int(r["bucket"]) if r["secs"] is None else rollup.bucket_of(float(r["secs"]))
        key = (r["name"], r["version"], int(r["day"]), b)
        out[key] = out.get(key, 0) + int(r["runs"])
    return [
        {"agent": k[0], "version": k[1], "day": k[2], "bucket": k[3], "runs": n}
        for k, n in out.items()
    ]


def failing(tx: Tx, tenant: str | None, since_day: int | None) -> list[dict[str, Any]]:
    """Failed and ``needs_human`` runs by agent, version, failing step and class, with
    their cost and seconds."""
    folded, live = _window(tenant, since_day, "r")
    join, cls = rollup.failing_sql("r")
    rows = tx.fetchall(
        "SELECT name, version, step, error_class, SUM(runs) AS n, SUM(cost_usd) AS cost, "
        "SUM(seconds) AS secs FROM ("
        "SELECT name, version, step, error_class, runs, cost_usd, seconds FROM rollup_failing "
        f"WHERE {folded} UNION ALL "
        f"SELECT r.name, r.version, COALESCE(s.name, '(no step)'), {cls}, 1, r.cost_usd, "
        f"r.updated_at - r.created_at FROM runs r {join} WHERE {live} "
        "AND r.status IN ('failed', 'needs_human')"
        ") u GROUP BY name, version, step, error_class",
        _params(tenant, since_day),
    )
    return [
        {"agent": r["name"], "version": r["version"], "step": r["step"],
         "error_class": r["error_class"] or None, "failures": int(r["n"]),
         "cost_usd": float(r["cost"] or 0), "seconds": float(r["secs"] or 0)}
        for r in rows
    ]  # fmt: skip
