"""Tenant period budgets: spend and tokens per tenant per period, reserved before a call.

A budget row (``tenant_budgets``, set with ``set_tenant_budget`` of
``gateway/_queries.py``) gives a period in seconds and limits. The period's usage is a
row in the store (``tenant_usage``), started from the journal's model steps of the
period and then moved only by reservations (one guarded update: taken only if it fits)
and settlements (real minus reserved), so workers reserving at once cannot overshoot
the limit together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TenantBudget:
    """Limits of one tenant per period (None: no limit)."""

    tenant_id: str
    period_seconds: float = 86_400.0
    max_spend_usd: float | None = None
    max_tokens: int | None = None
    max_rps: float | None = None


@dataclass(frozen=True)
class TenantUsage:
    """A tenant's budget and what its runs used in the current period."""

    budget: TenantBudget
    period_start: float
    spend_usd: float
    tokens: int

    @property
    def period_end(self) -> float:
        return self.period_start + self.budget.period_seconds

    def refusal(self, reserve_usd: float, reserve_tokens: int) -> str | None:
        """Why a call reserving this much may not be made in this period, or None."""
        b = self.budget
        if b.max_spend_usd is not None and self.spend_usd + reserve_usd > b.max_spend_usd:
            return (
                f"tenant {b.tenant_id} spend limit for the period: ${self.spend_usd:.4f} spent "
                f"+ ${reserve_usd:.4f} reserved for the next model call > ${b.max_spend_usd:.4f}"
            )
        if b.max_tokens is not None and self.tokens + reserve_tokens > b.max_tokens:
            return (
                f"tenant {b.tenant_id} token limit for the period: {self.tokens} used + "
                f"{reserve_tokens} reserved for the next model call > {b.max_tokens}"
            )
        return None


def period_start(now: float, period_seconds: float) -> float:
    """The start of the fixed period holding ``now`` (periods aligned on the epoch, UTC)."""
    return math.floor(now / period_seconds) * period_seconds
