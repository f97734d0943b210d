"""Test your own agents and workflows: run an App in process on a private SQLite file
with the real engine and worker, a scripted model, and providers with real semantics.

    from agentledger import ScriptedModel, Turn
    from agentledger.testing import Harness, FakeProvider

    payments = FakeProvider("payments")

    async def test_a_timeout_after_the_charge_charges_once() -> None:
        payments.fail_next("timeout_after_apply")
        async with Harness(app) as h:
            run_id = await h.submit("concierge", {"message": "pay for b-1"})
            run = await h.run_until_settled(run_id)
        assert run.status == "completed"
        assert payments.applied_count() == 1

``chaos_effect(key)`` lets ``agentledger chaos`` count a tool's side effects at a
provider it cannot proxy (a no-op anywhere else).

Everything here uses the public API; nothing is simulated that the runtime does in
production (the journal, leases, status checks and retries are the real ones).
"""

from agentledger.testing._chaos import chaos_effect
from agentledger.testing._harness import Harness
from agentledger.testing._provider import (
    FAULTS,
    FakeProvider,
    KeyConflict,
    KeyInProgress,
    ProviderDown,
    ProviderTimeout,
)

__all__ = [
    "FAULTS",
    "FakeProvider",
    "Harness",
    "KeyConflict",
    "KeyInProgress",
    "ProviderDown",
    "ProviderTimeout",
    "chaos_effect",
]
