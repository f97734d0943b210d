"""Quotas are exact across service processes: two app instances, each with its own store
(as two ``serve`` processes have), served over real HTTP on one database and hammered at
once, never accept more runs than a tenant's quota."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx

from agentledger.store import open_store
from tests.service.conftest import mint, served, settings_for

TENANTS = ("t-a", "t-b", "t-c")
PER_TENANT = 40  # requests per tenant, half through each server


async def _hammer(store_url: str, **quota: Any) -> tuple[dict[str, Counter[int]], dict[str, int]]:
    """POST ``PER_TENANT`` runs for each tenant through two servers at once; return the
    statuses per tenant and the runs each tenant has in the database."""
    settings = settings_for(store_url, **quota)
    with served(settings) as one, served(settings) as two:
        keys = {t: await mint(one.app, t, "u", ["operator"], 3600) for t in TENANTS}
        limits = httpx.Limits(max_connections=100)
        async with (
            httpx.AsyncClient(base_url=one.base_url, timeout=60, limits=limits) as c1,
            httpx.AsyncClient(base_url=two.base_url, timeout=60, limits=limits) as c2,
        ):
            jobs = [
                (t, (c1 if i % 2 else c2).post("/v1/runs", json={"agent": "free"}, headers=keys[t]))
                for i in range(PER_TENANT)
                for t in TENANTS
            ]
            replies = await asyncio.gather(*(job for _, job in jobs))
    statuses: dict[str, Counter[int]] = {t: Counter() for t in TENANTS}
    for (tenant, _), reply in zip(jobs, replies, strict=True):
        statuses[tenant][reply.status_code] += 1
        if reply.status_code == 429:
            assert int(reply.headers["Retry-After"]) >= 1
    store = open_store(store_url)
    await store.open()
    try:
        sql = "SELECT tenant_id, COUNT(*) AS n FROM runs GROUP BY tenant_id"
        found = await store.read(lambda tx: tx.fetchall(sql))
    finally:
        await store.close()
    return statuses, {r["tenant_id"]: int(r["n"]) for r in found}


def _assert_exact(got: Counter[int], quota: int, tenant: str, statuses: Any) -> None:
    """Exactly ``quota`` accepted; the rest refused by the quota (429) or, on a machine so
    loaded that the database stayed locked past its busy timeout, asked to retry (503:
    nothing committed) -- never any other answer."""
    assert got[202] == quota, (tenant, statuses)
    assert set(got) <= {202, 429, 503}, (tenant, statuses)
    assert got[429] + got[503] == PER_TENANT - quota, (tenant, statuses)


async def test_runs_per_minute_is_exact_across_two_processes(store_url: str) -> None:
    statuses, stored = await _hammer(store_url, runs_per_minute=7)
    for tenant in TENANTS:
        _assert_exact(statuses[tenant], 7, tenant, statuses)
        assert stored[tenant] == 7


async def test_runs_in_flight_is_exact_across_two_processes(store_url: str) -> None:
    statuses, stored = await _hammer(store_url, max_in_flight=5)
    for tenant in TENANTS:
        _assert_exact(statuses[tenant], 5, tenant, statuses)
        assert stored[tenant] == 5
