"""Cooldowns: a model that fails repeatedly is skipped for a while.

A model is cooled down when, within ``window`` seconds, it failed ``failures`` times
(3 in a minute), or at least ``ratio`` of at least ``min_calls`` calls failed (50 % of 5).
Only provider trouble counts (rate limits, 5xx, timeouts, connection failures), not a
rejected request or a refusal. The state is per process, like a router's in-memory
cooldowns: each worker learns on its own, and a cooldown is an audit event of the run
that triggered it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from agentledger.errors import NotSent, ProviderError, RateLimited, ToolTimeout
from agentledger.models._errors import IncompleteAnswer

#: Failure classes that count toward a cooldown.
COUNTED = frozenset(
    {
        RateLimited.error_class,
        ProviderError.error_class,
        NotSent.error_class,
        ToolTimeout.error_class,
        IncompleteAnswer.error_class,
    }
)


@dataclass
class _Health:
    calls: deque[tuple[float, bool]] = field(default_factory=deque)
    until: float = 0.0


class Cooldowns:
    """Failure counts per model name, and the time each cooled model comes back."""

    def __init__(
        self,
        *,
        window: float = 60.0,
        failures: int = 3,
        min_calls: int = 5,
        ratio: float = 0.5,
        cooldown: float = 30.0,
    ) -> None:
        self.window, self.failures, self.min_calls = window, failures, min_calls
        self.ratio, self.cooldown = ratio, cooldown
        self._models: dict[str, _Health] = {}

    def cooled_until(self, name: str, now: float) -> float | None:
        """When a cooled-down model may be tried again (None: it may be tried now)."""
        health = self._models.get(name)
        if health is None or health.until <= now:
            return None
        return health.until

    def record(self, name: str, now: float, error_class: str | None) -> float | None:
        """Count one call (``error_class`` None: it answered). Returns the end of a
        cooldown this call started, else None."""
        health = self._models.setdefault(name, _Health())
        failed = error_class in COUNTED
        if error_class is not None and not failed:
            return None  # the request was at fault, not the provider
        calls = health.calls
        calls.append((now, failed))
        while calls and calls[0][0] < now - self.window:
            calls.popleft()
        if not failed or health.until > now:
            return None
        failures = sum(1 for _, bad in calls if bad)
        if failures >= self.failures or (
            len(calls) >= self.min_calls and failures / len(calls) >= self.ratio
        ):
            health.until = now + self.cooldown
            calls.clear()
            return health.until
        return None

    def reset(self) -> None:
        """Forget every model's history (tests)."""
        self._models.clear()


#: The process's cooldowns.
COOLDOWNS = Cooldowns()
