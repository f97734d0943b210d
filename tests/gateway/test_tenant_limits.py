"""Tenant limits of model calls in the store: period budgets reserved atomically, and the
requests-per-second bucket, on both backends and across stores (workers) at once."""

from __future__ import annotations

import asyncio
import time

from agentledger.store import open_store


async def test_concurrent_reservations_never_exceed_the_period_limit(store_url: str) -> None:
    """Four stores (four connections, as four workers) reserve at once: exactly as many
    calls as fit are taken, and the period's row never passes the limit."""
    stores = [open_store(store_url) for _ in range(4)]
    for s in stores:
        await s.open()
    try:
        await stores[0].set_tenant_budget("acme", 86_400, max_spend_usd=0.10, max_tokens=None)
        now = time.time()

        async def reserve(i: int) -> bool:
            row = await stores[i % 4].reserve_tenant_usage("acme", now, 0.01, 100)
            assert row is not None
            return bool(row["reserved"])

        taken = await asyncio.gather(*(reserve(i) for i in range(60)))
        assert sum(taken) == 10
        last = await stores[1].reserve_tenant_usage("acme", now, 0.0, 0)
        assert last is not None
        assert last["spend_usd"] <= 0.10 + 1e-9
        assert last["tokens"] == 1000
        # Settling gives back what the calls did not cost: room for more.
        await stores[2].settle_tenant_usage("acme", last["period_start"], -0.05, -500)
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
        await stores[0].set_tenant_budget("acme", 3600, max_tokens=1000)
        now = time.time()
        rows = await asyncio.gather(
            *(stores[i % 3].reserve_tenant_usage("acme", now, 0.0, 300) for i in range(12))
        )
        assert sum(1 for r in rows if r and r["reserved"]) == 3
        assert await stores[0].reserve_tenant_usage("other", now, 1.0, 1) is None
    finally:
        for s in stores:
            await s.close()
