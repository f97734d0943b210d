"""The garbage collector in long-running processes (``serve``, ``worker``).

A full (oldest-generation) collection walks every container object the process holds,
and stops the process while it does: every request in flight waits for it. Most of
those objects -- imported modules, the FastAPI app, its pydantic models -- live as long
as the process and are never garbage, so walking them again and again only adds to the
latency tail (how much: docs/benchmarks.md, "Full collections out of the tail"). The
entry points collect once after start-up and freeze what survived (:func:`gc.freeze`):
later full collections walk only what the process made since.

They also collect the youngest generation less often (:data:`YOUNG_THRESHOLD` new
container objects instead of Python's 700). A step makes and drops a few dozen
containers (its journal entry, batch, context, argument dicts), nearly all freed by
their reference counts as soon as the step is done: a young collection finds little to
free, and much of what it costs is paid per collection, not per object (the figures:
docs/benchmarks.md, "The engine's CPU per step, part 2").
"""

from __future__ import annotations

import gc

# New container objects between two collections of the youngest generation. The older
# generations keep Python's thresholds.
YOUNG_THRESHOLD = 10_000


def freeze_startup() -> None:
    """Collect the start-up garbage, then move every surviving object out of the
    collector's reach, and collect the youngest generation every
    :data:`YOUNG_THRESHOLD` new containers. Call once, in a process's entry point,
    after imports and set-up and before serving: frozen objects are never collected,
    so freezing a heap that keeps changing would only keep its garbage."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
