"""Tenant limits of model calls in the store: period budgets reserved atomically, and the
requests-per-second bucket, on both backends and across stores (workers) at once."""

from __future__ import annotations

import asyncio
import time

from agentledger.gateway import _queries as gateway_budgets
from agentledger.store import open_store


async def test_concurrent_reservations_never_exceed_the_period_limit(store_url: str) -> None:
    """Four stores (four connections, as four workers) reserve at once: exactly as many
    calls as fit are taken, and the period's row never passes the limit."""
    stores = [open_store(store_url) for _ in range(4)]
    for s in stores:
        await s.open()
    try:
        await stores[0].transact(
            gateway_budgets.set_tenant_budget, "acme", 86_400, max_spend_usd=0.10, max_tokens=None
        )
        now = time.time()

        async def reserve(i: int) -> bool:
            row = await stores[i % 4].transact(
                gateway_budgets.reserve_tenant_usage, "acme", now, 0.01, 100
            )
            assert row is not None
            return bool(row["reserved"])

        taken = await asyncio.gather(*(reserve(i) for i in range(60)))
        assert sum(taken) == 10
        last = await stores[1].transact(gateway_budgets.reserve_tenant_usage, "acme", now, 0.0, 0)
        assert last is not None
        assert last["spend_usd"] <= 0.10 + 1e-9
        assert last["tokens"] == 1000
        # Settling gives back what the calls did not cost: room for more.
        await stores[2].transact(
            gateway_budgets.settle_tenant_usage, "acme", last["period_start"], -0.05, -500
        )
        again = await asyncio.gather(*(reserve(i) for i in range(20)))
        assert sum(again) == 5
    finally:
        for s in stores:
            await s.close()


async def test_a_token_limit_is_reserved_the_same_way(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        await stores[0].transact(gateway_budgets.set_tenant_budget, "acme", 3600, max_tokens=1000)
        now = time.time()
        rows = await asyncio.gather(
            *(
                stores[i % 3].transact(gateway_budgets.reserve_tenant_usage, "acme", now, 0.0, 300)
                for i in range(12)
            )
        )
        assert sum(1 for r in rows if r and r["reserved"]) == 3
        assert (
            await stores[0].transact(gateway_budgets.reserve_tenant_usage, "other", now, 1.0, 1)
            is None
        )
    finally:
        for s in stores:
            await s.close()


async def test_the_request_rate_bucket_is_shared_by_every_store(store_url: str) -> None:
    """5 requests per second: of 20 at one instant across three stores, 5 go; the rest
    are told how long to wait; a second later 5 more go."""
    stores = [open_store(store_url) for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        await stores[0].transact(gateway_budgets.set_tenant_budget, "acme", 86_400, max_rps=5.0)
        now = time.time()
        rows = await asyncio.gather(
            *(
                stores[i % 3].transact(gateway_budgets.reserve_tenant_usage, "acme", now, 0.0, 10)
                for i in range(20)
            )
        )
        assert all(r is not None for r in rows)
        taken = [r for r in rows if r and r["reserved"]]
        refused = [r for r in rows if r and not r["reserved"]]
        assert len(taken) == 5
        assert all(r["refused"] == "rate" and 0 < r["retry_in"] <= 0.2 + 1e-9 for r in refused)
        # A request refused by the rate reserves nothing of the period budget.
        assert refused[-1]["tokens"] == 50
        later = await asyncio.gather(
            *(
                stores[i % 3].transact(
                    gateway_budgets.reserve_tenant_usage, "acme", now + 1.0, 0.0, 10
                )
                for i in range(8)
            )
        )
        assert sum(1 for r in later if r and r["reserved"]) == 5
    finally:
        for s in stores:
            await s.close()
