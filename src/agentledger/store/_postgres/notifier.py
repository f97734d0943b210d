"""PostgreSQL: the "new events" notification, sent on a connection of its own.

The service's event streams LISTEN on :data:`EVENTS_CHANNEL` (a hint: they also poll).
A journal commit never carries the NOTIFY itself: a transaction that notifies takes
the server's one notification-queue lock before its commit record and keeps it until
the commit is flushed, so notifying commits of every process on the server queue up
behind each other's WAL fsync instead of sharing one (and behind any other session's
notifying commit, a submit's for one). A notification alone writes no WAL of its own
(PostgreSQL commits it without waiting for a flush), so it holds that lock only for
moments, and on this connection whatever it waits for never holds up a journal commit.

:meth:`EventsNotifier.poke` after a commit: at most one notification per ``gap``
seconds, the last poke of a burst always announced (``gap`` after the one before), so
a stream is woken after every commit that was not announced yet. A notification that
fails on a connection lost while idle is sent again on a new one; one that fails on a
new connection is a hint lost (the stream's poll finds the events), and the connection
is opened again at the next poke.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentledger.store._postgres.connection import EVENTS_CHANNEL

log = logging.getLogger(__name__)
NOTIFY_GAP = 0.005  # seconds between two notifications of one process's journal commits
CLOSE_WAIT = 5.0  # seconds close() gives a notification still owed


class EventsNotifier:
    """Announces committed events on :data:`EVENTS_CHANNEL` from its own connection."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], gap: float = NOTIFY_GAP) -> None:
        self._connect = connect
        self._gap = gap
        self._conn: Any = None
        self._owed = False
        self._sending = False  # a notification is being sent
        self._next = 0.0  # monotonic time the next notification may go
        self._task: asyncio.Task[None] | None = None
        self._opening: asyncio.Future[Any] | None = None
        self._closed = False

    def poke(self) -> None:
        """Events were committed: announce them (now, or once the gap has passed)."""
        if self._closed:
            return
        self._owed = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="agentledger-pg-events-notify")

    async def _run(self) -> None:
        while self._owed and not self._closed:
            wait = self._next - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self._owed = False
            self._next = time.monotonic() + self._gap
            self._sending = True
            try:
                await self._send()
            finally:
                self._sending = False

    async def _send(self) -> None:
        while True:
            fresh = self._conn is None or self._conn.closed
            try:
                if fresh:
                    self._conn = await self._connected()
                await self._conn.execute("SELECT pg_notify(%s, '')", (EVENTS_CHANNEL,))
                return
            except Exception as exc:
                log.debug("events notification failed: %s", exc)
                await self._drop()
            # A connection lost while idle (server restart, terminated backend) is seen
            # only now: try once on a new one, or this commit, maybe a burst's last, is
            # never announced. A new connection that fails means the server is away: the
            # hint is lost, it costs the listener one poll period.
            if fresh:
                return

    async def _connected(self) -> Any:
        """A new connection; one still opening when :meth:`close` stops the sender is
        taken over by close's own notification, or closed once it is open: never a
        second one opened beside it, never one left to the garbage collector."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect())
        try:
            conn = await asyncio.shield(self._opening)  # close() finishes and closes it
        except asyncio.CancelledError:
            raise  # still opening: close() takes it
        except BaseException:
            self._opening = None
            raise
        self._opening = None
        return conn

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        """Stop: a notification still owed (waiting for its gap, or on the wire) is sent
        now, for at most ``CLOSE_WAIT`` seconds: the last commits of a process that stops
        are often a run's last events, and no later commit of it will announce them."""
        self._closed = True
        owed = self._owed or self._sending
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if owed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._send(), CLOSE_WAIT)
        opening, self._opening = self._opening, None
        if opening is not None:
            with contextlib.suppress(BaseException):
                await (await opening).close()
        await self._drop()
