"""``Store.swap_effect``: the outbox's effects-table claims, on every backend."""

from __future__ import annotations

from agentledger.records import Effect
from agentledger.store import Store


async def test_swap_effect_is_a_compare_and_set(store: Store) -> None:
    claim = Effect("k1", "run-a", 3, "claimed", {"outbox": "k1", "attempt": 1})
    assert await store.swap_effect(claim, None) == (True, claim)
    # A retry of the same write after a lost reply finds its own row: written.
    assert (await store.swap_effect(claim, None))[0] is True
    # Anyone else expecting no row loses, and is shown the holder.
    other = Effect("k1", "run-b", 1, "claimed", {"outbox": "k1", "attempt": 1})
    written, current = await store.swap_effect(other, None)
    assert not written and current == claim
    # Settled only from the status expected.
    done = Effect("k1", "run-a", 3, "done", {"id": "m1"})
    assert (await store.swap_effect(done, "failed"))[0] is False
    assert await store.swap_effect(done, "claimed") == (True, done)
    assert await store.get_effect("k1") == done
    # A released claim (failed) is claimed again.
    await store.swap_effect(Effect("k2", "run-a", 4, "failed"), None)
    again = Effect("k2", "run-a", 4, "claimed", {"attempt": 2})
    assert await store.swap_effect(again, "failed") == (True, again)
    assert await store.swap_effect(Effect("k3", "r", 1, "done"), "claimed") == (False, None)
