"""The gateway's part of the model step, installed as the engine's hooks
(``engine/_hooks.py``) when ``agentledger.gateway`` is imported: tenant period budgets
reserved and settled in the store, the cooldowns of failing models, and the live stream
of model tokens. The call protocol itself is :mod:`agentledger.engine._model_step`."""

from __future__ import annotations

from typing import Any

from agentledger.engine import _hooks as hooks
from agentledger.engine._hooks import TenantReservation
from agentledger.gateway import _queries as budgets
from agentledger.gateway import _stream as stream
from agentledger.gateway._cooldown import COOLDOWNS
from agentledger.gateway._tenants import TenantBudget, TenantUsage


async def reserve_tenant(
    store: Any, tenant_id: str, now: float, usd: float, tokens: int
) -> TenantReservation | None:
    """Reserve the call against the tenant's period budget in the store (one guarded
    update, so concurrent workers cannot overshoot): None when the tenant has no limits."""
    row = await store.transact(budgets.reserve_tenant_usage, tenant_id, now, usd, tokens)
    if row is None:
        return None
    budget = TenantBudget(
        tenant_id,
        float(row["period_seconds"]),
        row["max_spend_usd"],
        row["max_tokens"],
        row.get("max_rps"),
    )
    taken = bool(row["reserved"])
    spend, used = row["spend_usd"], row["tokens"]
    if taken:  # the row includes this call; the usage reported is what was there before
        spend, used = spend - usd, used - tokens
    usage = TenantUsage(budget, row["period_start"], spend, used)
    return TenantReservation(
        taken=taken,
        period_start=usage.period_start,
        period_end=usage.period_end,
        refused=row.get("refused"),
        reason="" if taken else usage.refusal(usd, tokens) or "",
        retry_in=float(row.get("retry_in") or 0.0),
        max_rps=budget.max_rps,
    )


async def settle_tenant(
    store: Any, tenant_id: str, period_start: float, usd: float, tokens: int
) -> None:
    """Move the tenant's period row by a settled call's real minus reserved spend."""
    await store.transact(budgets.settle_tenant_usage, tenant_id, period_start, usd, tokens)


def model_delta(store: Any, run_id: str, step_no: int, text: str, attempt: int) -> None:
    stream.publish(run_id, step_no, text, store, attempt)


def install() -> None:
    """Make these the engine's hooks: done when ``agentledger.gateway`` is imported."""
    hooks.install(
        reserve_tenant=reserve_tenant,
        settle_tenant=settle_tenant,
        model_cooled_until=COOLDOWNS.cooled_until,
        model_call_ended=COOLDOWNS.record,
        model_delta=model_delta,
    )
