"""Fixtures for the sandbox tests: one sandbox subprocess per module, reset per test.

Helpers are reached through fixtures (``api``), never ``from conftest import ...``, so
other packages' ``conftest.py`` files cannot shadow them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any, TypeVar

import httpx
import pytest

from agentledger_examples.stayhub.sandbox import SandboxServer

T = TypeVar("T")

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


#: The first length of a window a test opens (a hold, an outage, a lag, a time to live).
FIRST_WINDOW = 0.5
#: Past this length a miss is a failure: something keeps the window from being seen.
LAST_WINDOW = 32.0


class Missed(Exception):
    """A try saw its window closed before it was done: the next try gets a longer one."""


class Window:
    """A window of ``length`` seconds opened at ``opened`` (``time.monotonic()``, taken
    before the window was asked for, so the window ends after ``opened + length``)."""

    def __init__(self, length: float) -> None:
        self.length = length
        self.opened = time.monotonic()

    def check(self, seen: bool) -> None:
        """``seen``: what the try observed is what the window shows. Otherwise it is a
        miss when the window may have closed by now, a failure when it was surely open."""
        if seen:
            return
        if time.monotonic() >= self.opened + self.length:
            raise Missed
        raise AssertionError(f"not what a window open {self.length} s shows")


def within_window(attempt: Callable[[float], T], first: float = FIRST_WINDOW) -> T:
    """``attempt(length)`` with a window ``length`` seconds long, doubled after each
    :class:`Missed`. A short window keeps the test from waiting it out; a loaded machine
    can let it close before the test looks, so a miss is followed by a longer one (miss
    or not is judged by what the try saw and the window's clock, never by how long a
    request took)."""
    length = first
    while length <= LAST_WINDOW:
        try:
            return attempt(length)
        except Missed:
            length *= 2
    raise AssertionError(f"no window up to {LAST_WINDOW} s was seen open")


async def within_window_async(
    attempt: Callable[[float], Awaitable[T]], first: float = FIRST_WINDOW
) -> T:
    """:func:`within_window` for a try that is a coroutine."""
    length = first
    while length <= LAST_WINDOW:
        try:
            return await attempt(length)
        except Missed:
            length *= 2
    raise AssertionError(f"no window up to {LAST_WINDOW} s was seen open")


@pytest.fixture
def windows() -> SimpleNamespace:
    """The window helpers: ``Window``, ``Missed``, ``within_window``, ``within_window_async``."""
    return SimpleNamespace(
        Window=Window,
        Missed=Missed,
        within_window=within_window,
        within_window_async=within_window_async,
    )
