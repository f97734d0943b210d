"""Two `serve` processes asked "check now" about the same write at once (PostgreSQL,
where their transactions overlap): the second waits on the run's row and sees the first
ask, so the provider is asked once (service/_queries/console.claim_status_check)."""

from __future__ import annotations

import asyncio
import threading

from agentledger.service._queries.console import claim_status_check
from agentledger.store import open_store
from agentledger.store._tx import Tx
from tests.observe.test_attack_rollup import _waits_on_a_lock
from tests.store.test_prune import _finished


async def test_a_second_ask_from_another_process_waits_and_sees_the_first(pg_url: str) -> None:
    first, second = open_store(pg_url), open_store(pg_url)
    await first.open()
    await second.open()
    holding, go = threading.Event(), threading.Event()
    try:
        (run_id,) = await _finished(first, "t1", 1, steps=2)

        def ask_and_hold(tx: Tx) -> object:
            # The first ask is written and not committed yet (its provider call follows).
            asked = claim_status_check(tx, run_id, 1, "k-1", "pay", "ann", 30.0)
            holding.set()
            go.wait(60)
            return asked

        held = asyncio.create_task(first.transact(ask_and_hold))
        assert await asyncio.to_thread(holding.wait, 60)
        later = asyncio.create_task(
            second.transact(claim_status_check, run_id, 1, "k-1", "pay", "bob", 30.0)
        )
        while not later.done() and not await _waits_on_a_lock(second):
            await asyncio.sleep(0.01)
        go.set()
        assert await held is None  # the first ask goes to the provider
        earlier = await later
        assert earlier is not None and earlier["actor"] == "ann", earlier
    finally:
        go.set()
        await first.close()
        await second.close()
