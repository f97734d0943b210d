"""Claims are fair across tenants: one tenant's backlog cannot starve another's runs."""

from __future__ import annotations

import time

from agentledger.records import target_of
from agentledger.store import Store
from agentledger.store._base import NewRun
from agentledger.store._queries.runs import create_run
from agentledger.store._tx import Tx


async def test_a_claim_takes_every_tenant_round_robin(store: Store) -> None:
    now = time.time()

    def backlog(tx: Tx) -> None:
        # Tenant A's 200 runs are all older than tenant B's 5: oldest-first alone
        # would give A the whole claim.
        for i in range(200):
            create_run(tx, NewRun("workflow", "w", "1", {"i": i}, "A", available_at=now - 500 + i))
        for i in range(5):
            create_run(tx, NewRun("workflow", "w", "1", {"i": i}, "B", available_at=now - 100 + i))

    await store.transact(backlog)
    claimed = await store.claim_runs("w1", [target_of("w", "1")], 10, 30.0)
    by_tenant = sorted(r.tenant_id for r in claimed)
    assert by_tenant == ["A"] * 5 + ["B"] * 5
    # Within a tenant, oldest first.
    a_inputs = sorted(r.input["i"] for r in claimed if r.tenant_id == "A")
    assert a_inputs == [0, 1, 2, 3, 4]
    # The next claim: B has nothing left, A's backlog goes on in order.
    more = await store.claim_runs("w2", [target_of("w", "1")], 10, 30.0)
    assert [r.tenant_id for r in more] == ["A"] * 10
    assert sorted(r.input["i"] for r in more) == list(range(5, 15))
