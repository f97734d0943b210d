"""The fair claim ranks only each tenant's first due runs: what it takes must be what
ranking the whole backlog would take (targets, expired leases, not-yet-due runs)."""

from __future__ import annotations

import asyncio
import time

from agentledger.records import target_of
from agentledger.store import Store
from agentledger.store._base import NewRun
from agentledger.store._queries.runs import create_run
from agentledger.store._tx import Tx


def _runs(tx: Tx, tenant: str, name: str, n: int, first_at: float) -> list[str]:
    return [
        create_run(
            tx, NewRun("workflow", name, "1", {"i": i}, tenant, available_at=first_at + i)
        ).id
        for i in range(n)
    ]


async def test_a_tenants_runs_of_other_targets_do_not_hide_its_due_runs(store: Store) -> None:
    now = time.time()

    async def fill() -> tuple[list[str], list[str]]:
        def work(tx: Tx) -> tuple[list[str], list[str]]:
            # Tenant A's oldest runs are all for another workflow (not claimable by
            # this worker), its younger ones for ours; tenant B has a few of ours.
            _runs(tx, "A", "other", 30, now - 900)
            a = _runs(tx, "A", "w", 4, now - 500)
            b = _runs(tx, "B", "w", 2, now - 100)
            # Not due yet: never claimed, whatever its rank would be.
            _runs(tx, "B", "w", 3, now + 3600)
            return a, b

        return await store.transact(work)

    a, b = await fill()
    claimed = await store.claim_runs("w1", [target_of("w", "1")], 4, 30.0)
    # Round-robin by rank: A's first two and B's two, oldest first in each tenant.
    assert sorted(r.id for r in claimed) == sorted(a[:2] + b)
    more = await store.claim_runs("w2", [target_of("w", "1")], 10, 30.0)
    assert sorted(r.id for r in more) == sorted(a[2:])


async def test_an_expired_lease_is_ranked_with_its_tenants_due_runs(store: Store) -> None:
    now = time.time()

    def fill(tx: Tx) -> tuple[list[str], list[str]]:
        return _runs(tx, "A", "w", 3, now - 500), _runs(tx, "B", "w", 3, now - 400)

    a, b = await store.transact(fill)
    target = [target_of("w", "1")]
    # A's oldest run is claimed under a lease that has already expired (0 s).
    (dead,) = await store.claim_runs("dead-worker", target, 1, 0.0)
    assert dead.id == a[0]
    # Expired means past: wait until the store's clock has moved beyond that instant
    # (a claim in the same millisecond rightly sees the lease as still held).
    assert dead.lease_expires_at is not None
    while time.time() <= dead.lease_expires_at + 0.002:
        await asyncio.sleep(0.001)
    claimed = await store.claim_runs("w1", target, 2, 30.0)
    # Rank 1 of A is its expired run again (the oldest), rank 1 of B its oldest.
    assert sorted(r.id for r in claimed) == sorted([a[0], b[0]])
    again = next(r for r in claimed if r.id == a[0])
    assert again.lease_epoch == dead.lease_epoch + 1
