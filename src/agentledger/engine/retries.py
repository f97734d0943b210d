"""Retry by failure class (DESIGN.md):

| failure                      | retry                                              |
| rate limited (429)           | up to 3, exponential backoff + jitter, Retry-After |
| provider 5xx                 | up to 2                                            |
| timeout                      | once for reads; a write's timeout is unknown       |
| invalid arguments / schema   | never here: fed back to the model once             |
| refusal, policy block        | never                                              |
| business error               | never: it is the tool's answer                     |

Short backoffs sleep in the worker; longer ones park the run (``available_at``)
so no worker is held. Retry counts live in the step's journal entry, so a parked
or resumed step keeps counting where it stopped.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentledger.errors import ProviderError, RateLimited, ToolError, ToolTimeout
from agentledger.tools.contract import RetryPolicy

T = TypeVar("T")


@dataclass
class RetryState:
    """Attempts so far, per failure class; persisted in the journal entry."""

    attempts: int = 0
    rate_limited: int = 0
    provider_error: int = 0
    timeout: int = 0
    not_found: int = 0
    checks: int = 0
    history: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Any) -> RetryState:
        if not isinstance(data, dict):
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def backoff(policy: RetryPolicy, n: int, retry_after: float | None = None) -> float:
    """Exponential backoff with jitter; never shorter than Retry-After."""
    delay = min(policy.max_delay, policy.base_delay * (2 ** (n - 1)))
    delay = delay * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


def next_delay(
    policy: RetryPolicy, state: RetryState, exc: ToolError, *, is_read: bool
) -> float | None:
    """Record a failure; return the delay before the next attempt, or None for no retry."""
    state.history.append(exc.error_class)
    if isinstance(exc, RateLimited):
        state.rate_limited += 1
        if state.rate_limited > policy.rate_limited:
            return None
        return backoff(policy, state.rate_limited, exc.retry_after)
    if isinstance(exc, ProviderError):
        state.provider_error += 1
        if state.provider_error > policy.provider_error:
            return None
        return backoff(policy, state.provider_error)
    if isinstance(exc, ToolTimeout) and is_read:
        state.timeout += 1
        return 0.0 if state.timeout <= policy.timeout else None
    return None


async def call_with_timeout(fn: Callable[[], Awaitable[T]], timeout: float) -> T:
    """Await ``fn()`` for at most ``timeout`` seconds; a timeout is :class:`ToolTimeout`."""
    if timeout <= 0:
        raise ToolTimeout("no time left before the run's deadline")
    try:
        # asyncio.timeout runs the call in the current task: no extra Task per tool
        # call (asyncio.wait_for creates one on Python < 3.12); same TimeoutError.
        async with asyncio.timeout(timeout):
            return await fn()
    except TimeoutError:
        raise ToolTimeout(f"no answer within {timeout:.2f} s") from None


def as_tool_error(exc: Exception) -> ToolError:
    """Any exception a tool raises, as a failure class (unexpected ones: ``tool_error``)."""
    if isinstance(exc, ToolError):
        return exc
    return ToolError(f"{type(exc).__name__}: {exc}")
