"""StayHub sandbox: local test doubles for a hotel-booking agent's providers.

Hotel search, availability, guests, bookings, payments, CRM and email over HTTP on
loopback, with Stripe-like idempotency keys, status checks by key, a ledger of every
applied effect (persisted in SQLite) and seeded fault injection (see
:mod:`agentledger_examples.stayhub.sandbox.faults` for the ``--faults`` syntax).

Typical use in a test::

    with SandboxServer(faults="payments.create:timeout_after_commit@0.1,hold=2") as sb:
        ...  # call sb.url with Idempotency-Key headers, then
        assert check_invariants(sb.ledger())["ok"]
"""

from agentledger_examples.stayhub.sandbox.app import create_app
from agentledger_examples.stayhub.sandbox.faults import Fault, FaultConfig, parse_faults
from agentledger_examples.stayhub.sandbox.invariants import INVARIANTS, check_invariants
from agentledger_examples.stayhub.sandbox.server import SandboxServer, serve

__all__ = [
    "INVARIANTS",
    "Fault",
    "FaultConfig",
    "SandboxServer",
    "check_invariants",
    "create_app",
    "parse_faults",
    "serve",
]
