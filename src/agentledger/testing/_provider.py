"""An in-process provider with the semantics of a payments or booking API: requests
keyed by idempotency key, a ledger of every effect, a status query, and faults that
strike before or after the effect applies (the sandbox's fault grammar, in process)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentledger._canonical import canonical_json
from agentledger.errors import BusinessError, InProgress, ProviderError, ToolTimeout

# What a fault does, and whether the provider applied the effect before it struck:
# the cases a runtime must tell apart (resend safely, or ask the status endpoint).
FAULTS: dict[str, str] = {
    "error_before_apply": "a 5xx answer; nothing was applied",
    "error_after_apply": "a 5xx answer after the effect was applied",
    "timeout_before_apply": "no answer within the timeout; nothing was applied",
    "timeout_after_apply": "no answer within the timeout; the effect was applied",
    "in_progress": "a 409: the key's first request is still running; nothing applied yet",
}


class ProviderDown(ProviderError):
    """A 5xx answer from the fake provider."""


class ProviderTimeout(ToolTimeout):
    """No answer: the caller cannot know whether the effect applied."""


class KeyConflict(BusinessError):
    """The key was used before with other arguments (Stripe's idempotency error): a bug
    in the caller, never retried."""


class KeyInProgress(InProgress):
    """A request with this key is being processed (a 409: check or resend later)."""


@dataclass
class Effect:
    """One applied effect: its key, the request and the answer the provider gave."""

    key: str
    request: dict[str, Any]
    result: dict[str, Any]


@dataclass
class FakeProvider:
    """A provider keyed by idempotency key: the same key with the same request answers
    the stored result and applies nothing again; with another request it raises
    :class:`KeyConflict`. ``keys=False`` makes a provider that ignores keys (every call
    applies), to prove a tool's contract wrong in a test.

    Thread-safe: tools may call it from worker threads."""

    name: str
    keys: bool = True
    _ledger: list[Effect] = field(default_factory=list)
    _by_key: dict[str, Effect] = field(default_factory=dict)
    _faults: list[str] = field(default_factory=list)
    _calls: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_next(self, *faults: str) -> None:
        """Make the next calls fail, one fault per call, in order (see :data:`FAULTS`)."""
        for fault in faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        with self._lock:
            self._faults.extend(faults)

    async def call(
        self,
        key: str,
        request: dict[str, Any],
        apply: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Apply ``request`` once per ``key`` and answer its result (``apply`` computes
        the result; by default the request itself with the key as ``id``)."""
        with self._lock:
            self._calls[key] += 1
            fault = self._faults.pop(0) if self._faults else None
            if fault in ("error_before_apply", "timeout_before_apply", "in_progress"):
                return self._raise(fault)
            known = self._by_key.get(key) if self.keys else None
            if known is not None:
                if canonical_json(known.request) != canonical_json(request):
                    raise KeyConflict(f"{self.name}: key {key!r} was used with other arguments")
                result = known.result
            else:
                result = apply(request) if apply is not None else {"id": key, **request}
                effect = Effect(key=key, request=dict(request), result=result)
                self._ledger.append(effect)
                self._by_key[key] = effect
        await asyncio.sleep(0)  # an answer crosses the network: let others run
        if fault is not None:
            return self._raise(fault)
        return dict(result)

    def status(self, key: str) -> dict[str, Any] | None:
        """What the provider did with ``key``: its result, or None when nothing applied
        (what a tool's status check asks after a timeout)."""
        with self._lock:
            effect = self._by_key.get(key)
            return None if effect is None else dict(effect.result)

    def applied_count(self, key: str | None = None) -> int:
        """How many effects applied (for one key, or in all)."""
        with self._lock:
            return sum(1 for e in self._ledger if key is None or e.key == key)

    def calls(self, key: str) -> int:
        """How many requests reached the provider with ``key`` (resends included)."""
        with self._lock:
            return self._calls[key]

    def ledger(self) -> list[Effect]:
        """Every applied effect, oldest first."""
        with self._lock:
            return list(self._ledger)

    def _raise(self, fault: str) -> dict[str, Any]:
        if fault == "in_progress":
            raise KeyInProgress(f"{self.name}: 409 ({FAULTS[fault]})")
        if fault.startswith("timeout"):
            raise ProviderTimeout(f"{self.name}: no answer ({FAULTS[fault]})")
        raise ProviderDown(f"{self.name}: 503 ({FAULTS[fault]})")
