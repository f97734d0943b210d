"""Events audited under no run (a tenant's document changes, a user's memory changes)
never block the sealing of the runs' events, however many there are."""

from __future__ import annotations

import pytest

from agentledger import sealer
from agentledger.store import open_store
from agentledger.store.queries import service_audit
from tests.service import service_app


async def test_runless_events_do_not_stop_the_sealer(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sealer, "BATCH", 3)  # a round's batch: 3 records, not 500
    store = open_store(store_url)
    await store.open()
    try:
        for i in range(sealer.BATCH * sealer.MAX_BATCHES + 1):  # more than a round's worth
            await store.forget_facts("t1", f"u{i}", None, "ops:alice")
        run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
        for _ in range(3):  # rounds: sealing is not starved by the older runless ones
            await sealer.seal_once(store)
        checked, broken = await store.transact(service_audit.verify_chain, write=False)
        assert broken == [] and checked >= 1  # the run's submission was sealed
        events = await store.transact(
            lambda d, c: d.fetchall(c, "SELECT hash FROM events WHERE run_id = :r", {"r": run_id}),
            write=False,
        )
        assert events and all(e["hash"] is not None for e in events), events
        # Nothing left to seal: sealers do not keep opening write transactions, and
        # `audit verify --max-unsealed-age` does not fail on the runless events.
        assert await store.transact(service_audit.has_unsealed, write=False) is False
        assert await store.transact(service_audit.unsealed_tail, write=False) == (0, None)
    finally:
        await store.close()
