"""The garbage collector in long-running processes (``serve``, ``worker``).

A full (oldest-generation) collection walks every container object the process holds:
in ``serve`` that is ~75,000 objects of imported modules, the FastAPI app and its
pydantic models, and it stopped the process for 24-42 ms -- every request in flight
waited, the tail of ``POST /v1/runs`` at 1,000 runs/s. Those objects live as long as
the process, so the entry points collect once after start-up and freeze what survived
(:func:`gc.freeze`): later full collections walk only what the process made since.
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
