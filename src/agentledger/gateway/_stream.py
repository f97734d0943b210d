"""Live model tokens of running runs, for whoever listens (the service's SSE stream).

Deltas are published here while a streaming model answers. They are not journaled (the
journal records only the final message), so a listener that drops loses nothing the run
needs: a client that reconnects reads the final message from the journal's events.
Each delta names its step's ``attempt`` (1, 2, ...): an attempt that fails part-way (a
stream cut short, retried or answered by the fallback) is followed by deltas of a higher
attempt, and a listener drops the text it had of the earlier one.

Two ways a delta travels:

* in the process that runs the worker, straight to the queues of :func:`subscribe`
  (the service with ``serve --workers-inline N`` reads them there);
* on PostgreSQL, also to every other process, as a NOTIFY on :data:`DELTA_CHANNEL`
  (:mod:`agentledger.gateway._relay`), so a service fed by separate worker processes
  streams them too. Each payload names the process that sent it (:data:`ORIGIN`), so a
  process that receives its own deltas back ignores them.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from agentledger.gateway._relay import DELTA_CHANNEL, DELTA_EVENT, ORIGIN, relay_for

_listeners: dict[str, list[asyncio.Queue[dict[str, Any]]]] = {}


def subscribe(run_id: str, maxsize: int = 1000) -> asyncio.Queue[dict[str, Any]]:
    """A queue receiving ``{"type": "model.delta", "run_id", "step_no", "attempt",
    "text"}`` events."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize)
    _listeners.setdefault(run_id, []).append(queue)
    return queue


def unsubscribe(run_id: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
    """Stop delivering to ``queue``."""
    queues = _listeners.get(run_id, [])
    if queue in queues:
        queues.remove(queue)
    if not queues:
        _listeners.pop(run_id, None)


def listened(run_id: str) -> bool:
    """Whether anyone in this process listens to ``run_id``."""
    return run_id in _listeners


def delta(run_id: str, step_no: int, text: str, attempt: int = 1) -> dict[str, Any]:
    """The event of one delta of a step's ``attempt``."""
    return {
        "type": DELTA_EVENT,
        "run_id": run_id,
        "step_no": step_no,
        "attempt": attempt,
        "text": text,
    }


def deliver(event: dict[str, Any]) -> None:
    """Hand a delta to this process's listeners of its run; a full queue drops it (a slow
    reader must never hold up the model call)."""
    for queue in _listeners.get(event["run_id"], ()):
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(event)


def publish(run_id: str, step_no: int, text: str, store: Any = None, attempt: int = 1) -> None:
    """Hand a delta to this process's listeners and, when ``store`` is PostgreSQL, to the
    other processes on it. Never blocks and never raises into the model call."""
    event = delta(run_id, step_no, text, attempt)
    deliver(event)
    url = getattr(store, "url", None)
    if isinstance(url, str) and url.startswith(("postgresql:", "postgres:")):
        relay_for(url).send(event)


__all__ = [
    "DELTA_CHANNEL",
    "DELTA_EVENT",
    "ORIGIN",
    "deliver",
    "delta",
    "listened",
    "publish",
    "subscribe",
    "unsubscribe",
]
