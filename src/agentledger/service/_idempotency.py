"""Idempotency-Key (IETF httpapi draft): parsing, fingerprints, in-process in-flight waits.

The durable part -- key row and run row in one transaction, a replay of the recorded
response, a different body refused -- is in ``service/_accepting.py``. Here:
the header's syntax (1-255 printable ASCII characters, bare or as a quoted sf-string),
the fingerprint (SHA-256 of the canonical JSON body), and concurrent requests with the
same key in this process: they wait for the first to commit and then replay it; one
still waiting after ``idempotency_wait`` gets 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from agentledger._canonical import NotJournalable, canonical_json
from agentledger.service._problems import Problem


def parse_key(header: str | None) -> str | None:
    """The key of an ``Idempotency-Key`` header, None when absent; 400 when malformed."""
    if header is None:
        return None
    value = header.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if not 1 <= len(value) <= 255 or not all(" " <= ch <= "~" for ch in value):
        raise Problem(
            "invalid-idempotency-key",
            "Idempotency-Key must be 1-255 printable ASCII characters",
        )
    return value


def fingerprint(body: Any) -> str:
    """SHA-256 of the canonical JSON of the request body."""
    try:
        text = canonical_json(body)
    except NotJournalable as exc:
        raise Problem("validation-error", f"body: {exc}") from exc
    return hashlib.sha256(text.encode()).hexdigest()


class InFlight:
    """Requests of this process currently holding each (tenant, key)."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def hold(self, tenant_id: str, key: str, wait: float) -> AsyncIterator[None]:
        """Hold the key; a second holder waits up to ``wait`` s, then 409."""
        ident = (tenant_id, key)
        lock = self._locks.setdefault(ident, asyncio.Lock())
        try:
            if lock.locked():
                await asyncio.wait_for(lock.acquire(), timeout=max(wait, 0.0))
            else:
                await lock.acquire()
        except TimeoutError:
            raise Problem(
                "idempotency-in-flight",
                f"a request with Idempotency-Key {key!r} is still being processed; retry later",
                headers={"Retry-After": "1"},
            ) from None
        try:
            yield
        finally:
            lock.release()
            # No waiter queued: forget the lock (a waiter holds its own reference).
            idle = not lock.locked() and not getattr(lock, "_waiters", None)
            if idle and self._locks.get(ident) is lock:
                del self._locks[ident]
