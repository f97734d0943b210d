"""What the engine reports about its steps, and who listens: the kernel's hook points.

The engine calls these module-level functions around a run's execution, its model and
tool attempts and its replayed steps; by default each is a no-op. A feature installs
its own with :func:`install` when it is imported: ``agentledger.observe`` the
OpenTelemetry spans and the process histograms, ``agentledger.memory`` the user's facts
an agent built with ``memory=True`` reads (that one has no silent default). The engine
looks each one up on this module at the call, so an installed hook costs what a direct
call into the feature would, and the kernel never imports the feature.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from agentledger.errors import UsageError


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
    raise UsageError(
        "an agent built with memory=True needs agentledger.memory: import it in the app"
    )


#: The hook points :func:`install` accepts.
HOOKS = (
    "memory_note",
    "run_span",
    "set_outcome",
    "tool_attempt",
    "replayed_step",
    "model_step_scope",
    "workflow_step",
    "model_attempt",
)


def install(**hooks: Callable[..., Any]) -> None:
    """Replace the named hook points (see :data:`HOOKS`) with ``hooks``."""
    unknown = set(hooks) - set(HOOKS)
    if unknown:
        raise TypeError(f"unknown engine hooks: {sorted(unknown)}")
    globals().update(hooks)
