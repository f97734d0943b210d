"""The garbage collector in long-running processes (``serve``, ``worker``).

A full (oldest-generation) collection walks every container object the process holds,
and stops the process while it does: every request in flight waits for it. Most of
those objects -- imported modules, the FastAPI app, its pydantic models -- live as long
as the process and are never garbage, so walking them again and again only adds to the
latency tail (how much: docs/benchmarks.md, "Full collections out of the tail"). The
entry points collect once after start-up and freeze what survived (:func:`gc.freeze`):
later full collections walk only what the process made since.
"""

from __future__ import annotations

import gc


def freeze_startup() -> None:
    """Collect the start-up garbage, then move every surviving object out of the
    collector's reach. Call once, in a process's entry point, after imports and
    set-up and before serving: frozen objects are never collected, so freezing a heap
    that keeps changing would only keep its garbage."""
    gc.collect()
    gc.freeze()
