"""heap.freeze_startup: start-up garbage collected, the survivors frozen out of full collections."""

from __future__ import annotations

import gc
import weakref

from agentledger import _heap as heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_freeze_startup_collects_garbage_cycles_and_freezes_survivors() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    dead = weakref.ref(a)
    kept = _Node()
    del a, b
    threshold = gc.get_threshold()
    try:
        heap.freeze_startup()
        assert dead() is None, "the start-up garbage must be collected, not frozen"
        assert gc.get_freeze_count() > 0
        # What survived is out of the collector's reach: a full collection skips it.
        assert not any(o is kept for o in gc.get_objects())
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert any(o is kept for o in gc.get_objects())


def test_freeze_startup_collects_the_youngest_generation_less_often() -> None:
    before = gc.get_threshold()
    gc.set_threshold(700, 11, 12)  # Python's youngest threshold; the others set apart
    try:
        heap.freeze_startup()
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 11, 12)
        assert heap.YOUNG_THRESHOLD > 700
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
