"""Live model tokens of running runs, for whoever listens (the service's SSE stream).

Deltas are published here while a streaming model answers; they are not journaled (the
journal records only the final message), so a listener that drops loses nothing the run
needs. Per process: a listener subscribes in the process that runs the worker.

Not yet on the service's SSE stream: ``service/routers/events.py`` streams journaled
events only. Merging deltas there reaches only workers run inside the service process
(``workers_inline``); workers in other processes would need a cross-process channel
(PostgreSQL NOTIFY, or a delta table outside the journal), which is left open.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

_listeners: dict[str, list[asyncio.Queue[dict[str, Any]]]] = {}


def subscribe(run_id: str, maxsize: int = 1000) -> asyncio.Queue[dict[str, Any]]:
    """A queue receiving ``{"type": "model.delta", "run_id", "step_no", "text"}`` events."""
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


def publish(run_id: str, step_no: int, text: str) -> None:
    """Hand a delta to every listener of the run; a full queue drops it (never blocks)."""
    for queue in _listeners.get(run_id, ()):
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(
                {"type": "model.delta", "run_id": run_id, "step_no": step_no, "text": text}
            )
