"""Tenant period budgets of model calls: the limits, and the usage summed from the journal."""

from __future__ import annotations

import math
import time
from typing import Any

from agentledger.store.dialect import Dialect


def set_tenant_budget(
    d: Dialect,
    conn: Any,
    tenant_id: str,
    period_seconds: float,
    max_spend_usd: float | None,
    max_tokens: int | None,
) -> None:
    """Create or replace a tenant's limits."""
    params = {
        "t": tenant_id,
        "p": period_seconds,
        "s": max_spend_usd,
        "k": max_tokens,
        "at": time.time(),
    }
    d.execute(conn, "DELETE FROM tenant_budgets WHERE tenant_id = :t", params)
    d.execute(
        conn,
        "INSERT INTO tenant_budgets (tenant_id, period_seconds, max_spend_usd, max_tokens, "
        "updated_at) VALUES (:t, :p, :s, :k, :at)",
        params,
    )


def tenant_model_usage(d: Dialect, conn: Any, tenant_id: str, now: float) -> dict[str, Any] | None:
    """The tenant's limits and its model steps' spend and tokens in the current period
    (None: the tenant has no limits)."""
    rows = d.fetchall(
        conn,
        "SELECT period_seconds, max_spend_usd, max_tokens FROM tenant_budgets WHERE tenant_id = :t",
        {"t": tenant_id},
    )
    if not rows:
        return None
    budget = dict(rows[0])
    period = float(budget["period_seconds"])
    since = math.floor(now / period) * period
    used = d.fetchall(
        conn,
        "SELECT COALESCE(SUM(s.cost_usd), 0) AS spend, COALESCE(SUM(s.tokens), 0) AS tokens "
        "FROM runs r JOIN steps s ON s.run_id = r.id "
        "WHERE r.tenant_id = :t AND s.kind = 'model' AND s.started_at >= :since",
        {"t": tenant_id, "since": since},
    )
    return {
        **budget,
        "period_start": since,
        "spend_usd": float(used[0]["spend"]),
        "tokens": int(used[0]["tokens"]),
    }
