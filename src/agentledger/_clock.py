"""The engine's clock, injectable so step protocols can be tested in milliseconds.

Wall time (``now``) stamps journal entries and decides when a parked run is due;
``monotonic`` measures timeouts and active time; ``sleep`` waits a short backoff.
Lease expiry is *not* judged here: the store judges it by the database's clock.
"""

from __future__ import annotations

import asyncio
import time


class Clock:
    """The real clock."""

    def now(self) -> float:
        """Wall-clock seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (timeouts, durations)."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a short backoff inside a step)."""
        await asyncio.sleep(seconds)


class FakeClock(Clock):
    """A clock that moves only when told to, or when something sleeps on it."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 1000.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward."""
        self._now += seconds
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


SYSTEM = Clock()

__all__ = ["SYSTEM", "Clock", "FakeClock"]
