"""The StayHub sandbox's faults: the runtime's fault grammar on the sandbox's endpoints.

The grammar itself (syntax, kinds, parameters, the injector) is
:mod:`agentledger._chaos.faults`, shared with ``agentledger chaos``; this module names
what the sandbox accepts: its endpoints, which of them write, and the kinds it
implements (``decline`` on ``payments.create``; ``lag`` on status lookups:
``bookings.status``, ``payments.status``, and ``status`` for the generic
``GET /idempotency/{endpoint}/{key}``; ``keyless`` on write endpoints: the endpoint ignores
the ``Idempotency-Key`` header, as SendGrid's and Postmark's mail APIs have none, and a
status check by key answers 400 ``idempotency_not_supported``; on ``crm`` the creation
then dedupes by the guest's email with 409 ``contact_exists``, as HubSpot does).

``timeout_after_commit`` holds any committed answer, stored failures included (a 402
decline whose response is lost: the status check must report ``failed``).

The JSON shape (``GET``/``PUT /faults``) is :meth:`FaultConfig.to_dict`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from agentledger._chaos.faults import (
    Failure,
    Fault,
    FaultConfig,
    Grammar,
)
from agentledger._chaos.faults import FaultInjector as _FaultInjector
from agentledger._chaos.faults import parse_faults as _parse_faults

__all__ = [
    "ENDPOINTS",
    "EXAMPLE_SPEC",
    "FAULT_KINDS",
    "GRAMMAR",
    "WRITE_ENDPOINTS",
    "Failure",
    "Fault",
    "FaultConfig",
    "FaultInjector",
    "config_from_dict",
    "grammar_help",
    "parse_faults",
]

ENDPOINTS: tuple[str, ...] = (
    "search",
    "availability",
    "guests",
    "bookings.create",
    "bookings.status",
    "bookings.cancel",
    "payments.create",
    "payments.status",
    "payments.refund",
    "crm",
    "crm.update",
    "email",
    "status",
)
"""Endpoint names a fault can target (``*`` targets all of them)."""

FAULT_KINDS: tuple[str, ...] = (
    "latency",
    "timeout_after_commit",
    "hold",
    "rate_limit",
    "error",
    "outage",
    "decline",
    "error_after_commit",
    "lag",
    "keyless",
)
"""Fault kinds the sandbox implements."""

WRITE_ENDPOINTS: frozenset[str] = frozenset(
    {
        "bookings.create",
        "bookings.cancel",
        "payments.create",
        "payments.refund",
        "crm",
        "crm.update",
        "email",
    }
)
"""Endpoints that change something (they take an ``Idempotency-Key``)."""

_MODE_OF: dict[str, str] = {"crm.update": "crm"}  # a keyless CRM updates without keys too

EXAMPLE_SPEC = (
    "payments.create:timeout_after_commit@0.1,hold=30;search:rate_limit@0.5,retry_after=1;"
    "email:outage,duration=20;seed=7"
)

GRAMMAR = Grammar(
    endpoints=ENDPOINTS,
    write_endpoints=WRITE_ENDPOINTS,
    kinds=FAULT_KINDS,
    only={"decline": frozenset({"payments.create"})},
    example=EXAMPLE_SPEC,
)
"""What the sandbox accepts of the grammar."""


def grammar_help() -> str:
    """The ``--faults`` grammar in a few lines, for the CLI's own ``--help``."""
    return (
        "Entries separated by ';': ENDPOINT:KIND[@PROBABILITY][,PARAM=VALUE...] or seed=N. "
        f"ENDPOINT: {', '.join(ENDPOINTS)} or * (all). PROBABILITY: 0 to 1 (default 1). "
        "KIND: latency,ms=N | timeout_after_commit,hold=S | hold,hold=S | "
        "rate_limit,retry_after=N | error,status=5xx | outage,duration=S (or start=S,end=S) "
        "| decline (payments.create) | error_after_commit,status=N,save=0|1 | lag,lag=S "
        "(status lookups) | keyless (write endpoints); every kind takes count=N (fire at "
        "most N times)."
    )


def parse_faults(spec: str) -> FaultConfig:
    """Parse a sandbox ``--faults`` spec; raise ``ValueError`` in one line if bad."""
    return _parse_faults(spec, GRAMMAR)


def config_from_dict(data: Mapping[str, Any]) -> FaultConfig:
    """A sandbox fault config from its JSON shape (or ``{"spec": ...}``)."""
    return FaultConfig.from_dict(data, GRAMMAR)


class FaultInjector(_FaultInjector):
    """The runtime's injector, with the sandbox's shared modes (a keyless CRM updates
    without keys too)."""

    def __init__(
        self, config: FaultConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(config, clock, modes=_MODE_OF)
