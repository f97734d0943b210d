"""Never two attempts of one step at once in one process, whatever the lease does.

A lease can be lost and re-claimed by the same worker while its first execution of
a step is still inside the tool call (a lease shorter than the call, a stalled
event loop). The fence stops the stale execution's *writes*, not its *calls*. This
registry holds every step (run id, step number) and outbox row being attempted in
this process; a second entrant waits for the first to leave and then re-reads the
journal -- it never calls while the first may still be calling.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Any

# Each held key, with the event its waiters wait on: made by the first waiter (most
# steps are never contended, so most holds need none).
_held: dict[Hashable, asyncio.Event | None] = {}
_waiting: dict[Hashable, int] = {}  # entrants waiting for each held key


class _Exclusive:
    """``async with exclusive(key) as fresh``: a plain class, not a generator, as it
    is entered once per step."""

    __slots__ = ("_key",)

    def __init__(self, key: Hashable) -> None:
        self._key = key

    async def __aenter__(self) -> bool:
        key = self._key
        waited = False
        while key in _held:
            waited = True
            done = _held[key]
            if done is None:
                done = _held[key] = asyncio.Event()
            _waiting[key] = _waiting.get(key, 0) + 1
            try:
                await done.wait()
            finally:
                _waiting[key] -= 1
                if not _waiting[key]:
                    del _waiting[key]
        _held[key] = None
        return not waited

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        done = _held.pop(self._key)
        if done is not None:
            done.set()


def exclusive(key: Hashable) -> _Exclusive:
    """Hold ``key`` for the body. Yields False if another holder had to be waited for
    (the caller must re-read what that holder may have written), True otherwise."""
    return _Exclusive(key)


def contended(key: Hashable) -> bool:
    """Whether another entrant waits for ``key`` now (it will re-read the journal as
    soon as the holder leaves: what the holder decided must be committed by then)."""
    return key in _waiting


@asynccontextmanager
async def try_exclusive(key: Hashable) -> AsyncIterator[bool]:
    """Hold ``key`` for the body if nobody does; yields False (holding nothing) if
    another attempt of it runs now -- the caller abandons instead of calling."""
    if key in _held:
        yield False
        return
    async with exclusive(key) as fresh:
        yield fresh


__all__ = ["contended", "exclusive", "try_exclusive"]
