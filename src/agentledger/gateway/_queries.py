"""Tenant period budgets of model calls: the limits, and the usage summed from the journal."""

from __future__ import annotations

import math
import time
from typing import Any

from agentledger.store._tx import Tx


def set_tenant_budget(
    tx: Tx,
    tenant_id: str,
    period_seconds: float,
    max_spend_usd: float | None = None,
    max_tokens: int | None = None,
    max_rps: float | None = None,
) -> None:
    """Create or replace a tenant's limits."""
    params = {
        "t": tenant_id,
        "p": period_seconds,
        "s": max_spend_usd,
        "k": max_tokens,
        "r": max_rps,
        "at": time.time(),
    }
    tx.execute("DELETE FROM tenant_budgets WHERE tenant_id = :t", params)
    tx.execute("DELETE FROM tenant_rate WHERE tenant_id = :t", params)  # a new bucket
    tx.execute(
        "INSERT INTO tenant_budgets (tenant_id, period_seconds, max_spend_usd, max_tokens, "
        "max_rps, updated_at) VALUES (:t, :p, :s, :k, :r, :at)",
        params,
    )


def reserve_tenant_usage(
    tx: Tx, tenant_id: str, now: float, usd: float, tokens: int
) -> dict[str, Any] | None:
    """Reserve ``usd`` and ``tokens`` against the tenant's period budget, atomically.

    One guarded UPDATE of the period's usage row takes the reservation only while the
    row plus this call stays within the limits; its row count says whether it was taken,
    so two workers can never both pass a check that only one of them fits. Returns None
    when the tenant has no limits, else the limits, the row (after the reservation when
    ``reserved``) and ``reserved``.
    """
    rows = tx.fetchall(
        "SELECT period_seconds, max_spend_usd, max_tokens, max_rps FROM tenant_budgets "
        "WHERE tenant_id = :t",
        {"t": tenant_id},
    )
    if not rows:
        return None
    budget = dict(rows[0])
    period = float(budget["period_seconds"])
    since = math.floor(now / period) * period
    params = {"t": tenant_id, "p": since, "usd": usd, "k": tokens}
    # The period's row starts from what the journal already holds (a budget set mid-period
    # counts the spend before it); later calls move it by reservation and settlement only.
    tx.execute(
        "INSERT INTO tenant_usage (tenant_id, period_start, spend_usd, tokens) "
        "SELECT :t, :p, COALESCE(SUM(s.cost_usd), 0), COALESCE(SUM(s.tokens), 0) "
        "FROM runs r JOIN steps s ON s.run_id = r.id "
        "WHERE r.tenant_id = :t AND s.kind = 'model' AND s.started_at >= :p "
        "ON CONFLICT (tenant_id, period_start) DO NOTHING",
        params,
    )
    guards = []
    if budget["max_spend_usd"] is not None:
        guards.append(" AND spend_usd + :usd <= :max_s")
        params["max_s"] = float(budget["max_spend_usd"])
    if budget["max_tokens"] is not None:
        guards.append(" AND tokens + :k <= :max_k")
        params["max_k"] = int(budget["max_tokens"])
    taken = tx.execute(
        "UPDATE tenant_usage SET spend_usd = spend_usd + :usd, tokens = tokens + :k "
        "WHERE tenant_id = :t AND period_start = :p" + "".join(guards),
        params,
    )
    refused, retry_in = (None if taken == 1 else "budget"), 0.0
    if refused is None and budget["max_rps"] is not None:
        retry_in = take_request(tx, tenant_id, now, float(budget["max_rps"]))
        if retry_in > 0:  # no request left this instant: give the reservation back
            refused = "rate"
            tx.execute(
                "UPDATE tenant_usage SET spend_usd = spend_usd - :usd, tokens = tokens - :k "
                "WHERE tenant_id = :t AND period_start = :p",
                params,
            )
    row = tx.fetchall(
        "SELECT spend_usd, tokens FROM tenant_usage WHERE tenant_id = :t AND period_start = :p",
        params,
    )[0]
    return {
        **budget,
        "period_start": since,
        "spend_usd": float(row["spend_usd"]),
        "tokens": int(row["tokens"]),
        "reserved": refused is None,
        "refused": refused,
        "retry_in": retry_in,
    }


# The bucket's level at :now: refilled at :rate per second since ``at``, capped at
# :burst (a clock that went back refills nothing). Portable SQL (CASE, not MIN/LEAST).
_ELAPSED = "(CASE WHEN :now > at THEN :now - at ELSE 0 END)"
_FILLED = (
    f"(CASE WHEN level + {_ELAPSED} * :rate > :burst THEN :burst "
    f"ELSE level + {_ELAPSED} * :rate END)"
)


def take_request(tx: Tx, tenant_id: str, now: float, rate: float) -> float:
    """Take one request from the tenant's token bucket (``rate`` per second, bursts of
    one second's worth): 0.0 when taken, else the seconds until one is available.

    One guarded UPDATE, taken only if the refilled level holds a whole request, so
    workers sharing the store share the limit.
    """
    burst = max(1.0, rate)
    params: dict[str, Any] = {"t": tenant_id, "now": now, "rate": rate, "burst": burst}
    tx.execute(
        "INSERT INTO tenant_rate (tenant_id, level, at) VALUES (:t, :burst, :now) "
        "ON CONFLICT (tenant_id) DO NOTHING",
        params,
    )
    taken = tx.execute(
        f"UPDATE tenant_rate SET level = {_FILLED} - 1, "
        "at = CASE WHEN :now > at THEN :now ELSE at END "
        f"WHERE tenant_id = :t AND {_FILLED} >= 1",
        params,
    )
    if taken == 1:
        return 0.0
    row = tx.fetchall("SELECT level, at FROM tenant_rate WHERE tenant_id = :t", params)[0]
    level = min(burst, float(row["level"]) + max(0.0, now - float(row["at"])) * rate)
    return max((1.0 - level) / rate, 1e-3)


def settle_tenant_usage(
    tx: Tx, tenant_id: str, period_start: float, usd: float, tokens: int
) -> None:
    """Move a period's usage by a settled call's difference (real minus reserved)."""
    tx.execute(
        "UPDATE tenant_usage SET spend_usd = spend_usd + :usd, tokens = tokens + :k "
        "WHERE tenant_id = :t AND period_start = :p",
        {"t": tenant_id, "p": period_start, "usd": usd, "k": tokens},
    )
