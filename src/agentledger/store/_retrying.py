"""The store's one retry policy for its own infrastructure: reconnect after a lost
connection, retry after a rolled-back transaction (deadlock, serialization failure).

Used by the writer thread (``sqlstore.py``), PostgreSQL's async journal committer
(``postgres/async_commit.py``) and the LISTEN connection (``postgres/listen.py``), so
the three agree on the backoff, its cap and the window a lost connection gets.
Steps and outbox deliveries are retried by the engine's own loop
(``engine/_retries.py``), never here.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from agentledger._backoff import Backoff

RECONNECT_WINDOW = 60.0  # seconds a lost connection gets before its callers are failed
TRANSIENT_TRIES = 5  # a rolled-back transaction (deadlock, serialization) is tried again


@dataclass
class Reconnect:
    """Backoff state of one retried operation (not shared between operations)."""

    first: float = 0.1
    cap: float = 2.0
    window: float = RECONNECT_WINDOW
    transient_tries: int = TRANSIENT_TRIES
    transients: int = field(init=False, default=0)
    deadline: float = field(init=False)
    backoff: Backoff = field(init=False)

    def __post_init__(self) -> None:
        self.backoff = Backoff(self.first, self.cap, jitter=False)
        self.deadline = time.monotonic() + self.window

    def may_retry_transient(self) -> bool:
        """Count one rolled-back attempt; True while another try is allowed."""
        if self.transients >= self.transient_tries:
            return False
        self.transients += 1
        return True

    def transient_pause(self) -> float:
        """A short jittered pause before retrying a rolled-back transaction."""
        return random.uniform(0.005, 0.05) * self.transients

    def within_window(self) -> bool:
        """True while a lost connection is still worth reconnecting."""
        return time.monotonic() <= self.deadline

    def next_pause(self) -> float:
        """The pause before the next reconnect attempt (doubling up to ``cap``)."""
        return self.backoff.next()

    def reset(self) -> None:
        """Connected again: the next loss starts from the first delay."""
        self.backoff.reset()


__all__ = ["RECONNECT_WINDOW", "TRANSIENT_TRIES", "Reconnect"]
