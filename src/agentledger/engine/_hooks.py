"""What the engine reports about its steps, and who listens: the kernel's hook points.

The engine calls these module-level functions around a run's execution, its model and
tool attempts and its replayed steps. A feature installs its own with :func:`install`
when it is imported: ``agentledger.observe`` the OpenTelemetry spans and the process
histograms, ``agentledger.memory`` the user's facts an agent built with ``memory=True``
reads, ``agentledger.gateway`` the tenant budgets, the cooldowns of failing models and
the live stream of model tokens. The engine looks each one up on this module at the
call, so an installed hook costs what a direct call into the feature would, and the
kernel never imports the feature.

Where doing nothing is harmless (spans, cooldowns, the live stream) the default is a
no-op. Where it would spend money or run an agent other than as defined -- a priced
model call not checked against its tenant's budget, an agent built with ``memory=True``
without its facts -- the default refuses with :class:`MissingFeature`, naming the module
to import: the processes that run steps (the ``agentledger`` commands, the service, the
test harness) import those features, and one that does not stops instead of going on.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from agentledger._extras import MissingFeature


@dataclass
class Attempt:
    """What a hook learns while an attempt runs (set by the caller)."""

    response: Any = None
    resolution: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class _Unobserved:
    """An attempt nobody observes: a plain context manager yielding a fresh record."""

    __slots__ = ()

    def __enter__(self) -> Attempt:
        return Attempt()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        return None


_UNOBSERVED = _Unobserved()


@contextlib.asynccontextmanager
async def run_span(store: Any, run: Any, kind: str) -> AsyncIterator[None]:
    """Around one execution of ``run`` (``kind``: "agent" or "workflow")."""
    yield


def set_outcome(outcome: str) -> None:
    """Where the current run execution ended."""


def tool_attempt(exe: Any, step: Any, tool: Any, key: str, attempt: int) -> Any:
    """Around one tool attempt: a context manager yielding an :class:`Attempt`."""
    return _UNOBSERVED


def replayed_step(exe: Any, step: Any) -> None:
    """A step answered from the journal instead of being run again."""


def model_step_scope(step_no: int) -> Any:
    """Around the attempts of model step ``step_no``: a context manager."""
    return contextlib.nullcontext()


def workflow_step(exe: Any, step_no: int, name: str) -> Any:
    """Around the first pass of a workflow's ``ctx.step``: yields an :class:`Attempt`."""
    return _UNOBSERVED


def model_attempt(exe: Any, model: Any) -> Any:
    """Around one model attempt: a context manager yielding an :class:`Attempt`."""
    return _UNOBSERVED


async def memory_note(store: Any, run: Any) -> str:
    """The system message of what is remembered about ``run``'s user, for an agent built
    with ``memory=True``: ``agentledger.memory`` installs it when imported. Without it
    such an agent cannot run as defined, so it refuses instead of running without."""
    raise MissingFeature(
        "an agent built with memory=True needs agentledger.memory: import it in the app"
    )


@dataclass(frozen=True)
class TenantReservation:
    """What a tenant's period budget said to one priced model call."""

    taken: bool
    period_start: float
    period_end: float
    refused: str | None = None  # "budget" or "rate" when not taken
    reason: str = ""  # why not taken, said to the user
    retry_in: float = 0.0  # refused for the rate: seconds until a request is available
    max_rps: float | None = None


_NO_GATEWAY = (
    "a priced model call is checked against its tenant's budget by agentledger.gateway, "
    "which this process never imported: import agentledger.gateway where the worker "
    "starts (the agentledger commands and the service do); the call was not sent"
)


async def reserve_tenant(
    store: Any, tenant_id: str, now: float, usd: float, tokens: int
) -> TenantReservation | None:
    """Reserve a priced call's worst case against its tenant's period budget, before it
    is sent: None when the tenant has no limits. ``agentledger.gateway`` installs it;
    without it nothing can say whether the tenant has a budget, so the call is refused
    rather than sent unchecked."""
    raise MissingFeature(_NO_GATEWAY)


async def settle_tenant(
    store: Any, tenant_id: str, period_start: float, usd: float, tokens: int
) -> None:
    """Move the tenant's period usage by a settled call's real minus reserved spend."""
    raise MissingFeature(_NO_GATEWAY)


def model_cooled_until(name: str, now: float) -> float | None:
    """When model ``name``, cooled down after repeated failures, may be tried again."""
    return None


def model_call_ended(name: str, now: float, error_class: str | None) -> float | None:
    """One call of ``name`` ended (``error_class`` None: answered); the end of a
    cooldown it started, else None."""
    return None


def model_delta(store: Any, run_id: str, step_no: int, text: str, attempt: int) -> None:
    """A piece of a streaming answer, for live listeners (never blocks, never raises)."""


#: The hook points :func:`install` accepts.
HOOKS = (
    "memory_note",
    "reserve_tenant",
    "settle_tenant",
    "model_cooled_until",
    "model_call_ended",
    "model_delta",
    "run_span",
    "set_outcome",
    "tool_attempt",
    "replayed_step",
    "model_step_scope",
    "workflow_step",
    "model_attempt",
)


# The kernel's own hook of each point, as a process that installed nothing has them.
_KERNEL: dict[str, Callable[..., Any]] = {name: globals()[name] for name in HOOKS}


def kernel_hooks(*names: str) -> dict[str, Callable[..., Any]]:
    """The kernel's own hooks of ``names`` (every point when none is named), whatever a
    feature installed since: ``install(**kernel_hooks("reserve_tenant"))`` takes the
    feature's hook out again."""
    unknown = set(names) - set(HOOKS)
    if unknown:
        raise TypeError(f"unknown engine hooks: {sorted(unknown)}")
    return {name: _KERNEL[name] for name in names or HOOKS}


def install(**hooks: Callable[..., Any]) -> None:
    """Replace the named hook points (see :data:`HOOKS`) with ``hooks``."""
    unknown = set(hooks) - set(HOOKS)
    if unknown:
        raise TypeError(f"unknown engine hooks: {sorted(unknown)}")
    globals().update(hooks)
