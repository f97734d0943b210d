"""The figures ``/metrics`` computes from the store at scrape time.

The store is the truth shared by every worker, so gauges (runs by state, queue depth and
wait, outbox backlog, dead letters) and the totals that only grow (tokens, cost, lease
takeovers, budget hits, unknown outcomes) are read here, on the database's clock, and are
the same whichever process is scraped. Two parts: the live one, cheap at any volume, and
the settled history, which grows with every run (see :func:`snapshot`).
"""

from __future__ import annotations

from typing import Any

from agentledger.records import loads
from agentledger.store._queries import rollup
from agentledger.store._queries.events import EVENTS_TYPE_INDEXED
from agentledger.store._tx import Tx

# Audit event types that settle an unknown outcome, by the resolution they record.
UNKNOWN_RESOLUTIONS = {
    "tool.status_resolved": "status_check",
    "tool.effect_found": "effects_table",
}
UNKNOWN_SEEN = ("tool.unknown_outcome", "tool.resumed_unknown")


_LIVE = "status IN ('queued', 'running', 'waiting')"  # the runs_live partial index's


def snapshot(tx: Tx, *, live: bool = True, settled: bool = True) -> dict[str, Any]:
    """Store-derived metric values, as plain rows (see observe/_metrics.py).

    ``live``: what changes by the second and stays small at any volume, read through
    indexes -- runs not yet finished (by state, with their totals so far), the due
    queue, pending and dead outbox rows. ``settled``: what only grows with the store's
    history -- finished runs, delivered and dropped outbox rows (the daily rollup's sums
    and the rows not folded yet), the audit-event counts (by the events' type index);
    observe/_metrics.py reads it now and then, not per scrape.
    """
    data: dict[str, Any] = {}
    if live:
        data.update(_live(tx))
    if settled:
        data.update(_settled(tx))
    return data


def _live(tx: Tx) -> dict[str, Any]:
    now = tx.now
    runs = tx.fetchall(
        "SELECT status, name, version, tenant_id, usage_simulated, COUNT(*) AS n, "
        "SUM(tokens) AS tokens, "
        f"SUM(cost_usd) AS cost, SUM(resumes) AS resumes FROM runs WHERE {_LIVE} "
        "GROUP BY status, name, version, tenant_id, usage_simulated",
    )
    queued = tx.fetchall(
        f"SELECT name, version, COUNT(*) AS n, MAX({now} - available_at) AS wait FROM runs "
        f"WHERE status IN ('queued', 'waiting') AND available_at <= {now} "
        "GROUP BY name, version",
    )
    outbox = tx.fetchall(
        f"SELECT status, COUNT(*) AS n, MAX({now} - created_at) AS age FROM outbox "
        "WHERE status IN ('pending', 'dead') GROUP BY status",
    )
    return {"live_runs": runs, "queued": queued, "live_outbox": outbox}


def _settled(tx: Tx) -> dict[str, Any]:
    # The finished runs and settled outbox rows: the daily rollup's sums and the rows
    # not folded yet (store/_queries/rollup.py), each in one statement (one snapshot: a
    # fold committing meanwhile neither hides a run nor counts it twice).
    runs = tx.fetchall(
        "SELECT status, name, version, tenant_id, usage_simulated, SUM(n) AS n, "
        "SUM(tokens) AS tokens, SUM(cost) AS cost, SUM(resumes) AS resumes FROM ("
        "SELECT status, name, version, tenant_id, simulated AS usage_simulated, runs AS n, "
        "tokens, cost_usd AS cost, resumes FROM rollup_runs UNION ALL "
        "SELECT status, name, version, tenant_id, usage_simulated, 1, tokens, cost_usd, "
        f"resumes FROM runs WHERE {rollup.unfolded(states=rollup.FINAL)}"
        ") u GROUP BY status, name, version, tenant_id, usage_simulated",
    )
    settled_not = ", ".join(f"'{s}'" for s in rollup.OUTBOX_SETTLED_NOT)
    outbox = tx.fetchall(
        "SELECT status, SUM(n) AS n FROM (SELECT status, n FROM rollup_outbox UNION ALL "
        "SELECT status, 1 FROM outbox WHERE rolled = 0 "
        f"AND status NOT IN ({settled_not})) u GROUP BY status",
    )
    types = (*UNKNOWN_SEEN, *UNKNOWN_RESOLUTIONS)
    params = {f"t{i}": t for i, t in enumerate(types)}
    marks = ", ".join(f":{k}" for k in params)
    counted = tx.fetchall(
        f"SELECT type, COUNT(*) AS n FROM events WHERE type IN ({marks}) "
        f"AND {EVENTS_TYPE_INDEXED} GROUP BY type",
        params,
    )
    # Handovers are few; their reason and detail are JSON, so they are classified here.
    handovers = tx.fetchall(
        f"SELECT data FROM events WHERE type = 'run.handover' AND {EVENTS_TYPE_INDEXED}"
    )
    budget: dict[str, int] = {}
    handed_over_unknown = 0
    for row in handovers:
        data = loads(row["data"]) or {}
        if not isinstance(data, dict):
            continue
        if data.get("reason") == "budget":
            kind = str(data.get("detail") or "other").split(" ", 1)[0]
            budget[kind] = budget.get(kind, 0) + 1
        elif data.get("reason") == "unknown_outcome":
            handed_over_unknown += 1
    unknown: dict[str, int] = {"handed_over": handed_over_unknown}
    seen = 0
    for row in counted:
        if row["type"] in UNKNOWN_RESOLUTIONS:
            res = UNKNOWN_RESOLUTIONS[row["type"]]
            unknown[res] = unknown.get(res, 0) + int(row["n"])
        else:
            seen += int(row["n"])
    return {
        "settled_runs": runs,
        "settled_outbox": outbox,
        "budget_hits": budget,
        "unknown_resolutions": unknown,
        "unknown_seen": seen,
    }
