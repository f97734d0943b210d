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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentledger_examples.stayhub.sandbox.app import create_app
    from agentledger_examples.stayhub.sandbox.faults import Fault, FaultConfig, parse_faults
    from agentledger_examples.stayhub.sandbox.invariants import INVARIANTS, check_invariants
    from agentledger_examples.stayhub.sandbox.server import SandboxServer, serve

# Each name's module, imported when the name is first used: the app loads FastAPI, which
# a process that only starts the sandbox, parses ``--faults`` or checks a ledger never needs.
_MODULES = {
    "create_app": "app",
    "Fault": "faults",
    "FaultConfig": "faults",
    "parse_faults": "faults",
    "INVARIANTS": "invariants",
    "check_invariants": "invariants",
    "SandboxServer": "server",
    "serve": "server",
}

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


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
