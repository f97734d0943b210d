"""How long to wait before trying again: exponential backoff and Retry-After.

Every retry in the runtime waits through this module: a step's attempts
(``engine/_retries.py``), the store's reconnects (``store/_retrying.py``), a journal
write or a schema migration waiting out a lock, the worker's side loops, webhook
deliveries. One doubling rule and one parser mean a fix to either (a cap, a value a
server should never have sent) reaches every caller.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any


def exponential(n: int, first: float, cap: float) -> float:
    """The ``n``-th delay of a doubling backoff (``n`` from 1): ``first * 2**(n-1)``,
    at most ``cap``. Not jittered: a delay written down as a time (a webhook's next
    attempt) is the same on every reading."""
    n = max(1, n)
    if first <= 0:
        return 0.0
    # Bounded before doubling: a delivery's 1,000th attempt must not overflow a float.
    doublings = min(n - 1, max(0, math.ceil(math.log2(max(cap / first, 1.0)))))
    return min(cap, first * 2**doublings)


def jittered(delay: float) -> float:
    """A random pause between half of ``delay`` and all of it: processes failing
    together (a lost database) do not all come back at the same instant."""
    return random.uniform(delay / 2, delay)


class Backoff:
    """Delays that double from ``first`` up to ``cap``, jittered unless told not to;
    :meth:`reset` after a success starts over from ``first``."""

    def __init__(self, first: float = 0.05, cap: float = 2.0, *, jitter: bool = True) -> None:
        self.first, self.cap, self.jitter = first, cap, jitter
        self.tries = 0

    def reset(self) -> None:
        """Succeeded: the next failure waits ``first`` again."""
        self.tries = 0

    def next(self) -> float:
        """The pause before the next try."""
        self.tries += 1
        delay = exponential(self.tries, self.first, self.cap)
        return jittered(delay) if self.jitter else delay


def _seconds(text: str, unit: float) -> float | None:
    """A number of ``unit`` seconds; None for garbage and NaN, 0 for a negative, and
    ``inf`` kept (the caller's cap turns an endless wait into the class's failure)."""
    try:
        value = float(text) * unit
    except (TypeError, ValueError):
        return None
    if math.isnan(value):
        return None
    return max(0.0, value)


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` value asks to wait: delta-seconds or an HTTP date.

    None when there is no usable value (absent, garbage, NaN): the caller's own backoff
    applies. Never negative: a date in the past, or ``-5``, means "now". ``inf`` stays
    infinite (the engine's cap turns it into the class's failure)."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    seconds = _seconds(text, 1.0)
    if seconds is not None:
        return seconds
    try:
        return max(0.0, parsedate_to_datetime(text).timestamp() - time.time())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def retry_after(headers: Mapping[str, Any] | Any) -> float | None:
    """Seconds a provider's answer asks to wait: ``retry-after-ms`` (milliseconds, as
    OpenAI-style APIs send) before ``Retry-After``. ``headers`` is any mapping with
    ``get`` (case-insensitive for HTTP clients' header objects); unreadable headers
    mean no Retry-After."""
    try:
        ms = headers.get("retry-after-ms")
        value = headers.get("retry-after") if ms is None else None
    except Exception:
        return None
    if ms is not None:
        return _seconds(str(ms).strip(), 0.001)
    return retry_after_seconds(value)


__all__ = ["Backoff", "exponential", "jittered", "retry_after", "retry_after_seconds"]
