"""Fixtures for the sandbox tests: one sandbox subprocess per module, reset per test.

Helpers are reached through fixtures (``api``), never ``from conftest import ...``, so
other packages' ``conftest.py`` files cannot shadow them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentledger_examples.stayhub.sandbox import SandboxServer

STAY: dict[str, Any] = {
    "hotel_id": "h-lis-1",
    "guest_id": "g-100",
    "check_in": "2031-05-01",
    "nights": 2,
}


class StayHub(httpx.Client):
    """An httpx client on the sandbox with shortcuts for the common writes."""

    stay = STAY

    def book(self, key: str, timeout: float | None = None, **overrides: Any) -> httpx.Response:
        """POST /bookings for ``stay`` (with overrides) under ``key``."""
        body = {**STAY, **overrides}
        headers = {"Idempotency-Key": key}
        if timeout is None:
            return self.post("/bookings", json=body, headers=headers)
        return self.post("/bookings", json=body, headers=headers, timeout=timeout)

    def pay(self, key: str, booking: dict[str, Any], **overrides: Any) -> httpx.Response:
        """POST /payments of the booking's total under ``key``."""
        body = {
            "booking_id": booking["booking_id"],
            "guest_id": booking["guest_id"],
            "amount": booking["total"],
            **overrides,
        }
        return self.post("/payments", json=body, headers={"Idempotency-Key": key})


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    with SandboxServer() as sandbox:
        yield sandbox


@pytest.fixture
def sb(server: SandboxServer) -> SandboxServer:
    """The module's sandbox with an empty ledger and no faults."""
    server.clear_faults()
    server.reset()
    return server


@pytest.fixture
def api(sb: SandboxServer) -> Iterator[StayHub]:
    with StayHub(base_url=sb.url, trust_env=False, timeout=10) as client:
        yield client
