"""LISTEN/NOTIFY wake-ups for PostgreSQL workers (a hint; workers also poll)."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from agentledger.errors import UsageError
from agentledger.store._postgres.connection import RUNS_CHANNEL, connect, lost_cause
from agentledger.store._retrying import Reconnect

log = logging.getLogger(__name__)


def notify_runs(conn: Any, payload: str = "") -> None:
    """Announce on :data:`RUNS_CHANNEL` that runs may be claimable.

    Run it inside the transaction that made them runnable: PostgreSQL delivers
    the notification only when (and if) that transaction commits.
    """
    if payload:
        conn.execute("SELECT pg_notify(%s, %s)", (RUNS_CHANNEL, payload))
    else:
        conn.execute(f"NOTIFY {RUNS_CHANNEL}")


class RunListener:
    """A thread that LISTENs on :data:`RUNS_CHANNEL` and calls ``callback(payload)``.

    It owns its own autocommit connection. A dead connection -- the server
    restarted, the backend was terminated, the network dropped (TCP keepalives,
    plus a ``SELECT 1`` health check every ``health_interval`` seconds) -- is
    replaced with exponential backoff up to ``max_backoff`` seconds.

    Notifications sent while the listener was disconnected are lost, so after
    every reconnect the callback is called once with :attr:`RECONNECTED` (a
    payload no NOTIFY can carry): "you may have missed something, poll now". Workers must keep
    a polling fallback anyway; the listener only makes wake-ups fast.

    The callback runs on the listener thread; keep it short (e.g.
    ``loop.call_soon_threadsafe(event.set)``). Its exceptions are logged.

    >>> listener = RunListener(url, lambda payload: wake.set())
    >>> listener.start()          # returns at once; see wait_listening()
    >>> listener.stop()
    """

    RECONNECTED = "\x00reconnected"  # PostgreSQL text cannot hold NUL: never a real payload

    def __init__(
        self,
        url: str,
        callback: Callable[[str], None],
        *,
        channel: str = RUNS_CHANNEL,
        poll_interval: float = 0.5,
        health_interval: float = 5.0,
        max_backoff: float = 5.0,
        application_name: str = "agentledger-listener",
    ) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", channel):
            raise UsageError(f"invalid LISTEN channel {channel!r}; use letters, digits and _")
        self.url = url
        self.callback = callback
        self.channel = channel
        self.poll_interval = poll_interval
        self.health_interval = health_interval
        self.max_backoff = max_backoff
        self.application_name = application_name
        self.reconnects = 0  # successful re-LISTENs after a lost connection
        self.backend_pid: int | None = None
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="agentledger-listener", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening and close the connection (waits for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wait_listening(self, timeout: float | None = None) -> bool:
        """Block until LISTEN is active (again); False on timeout."""
        return self._listening.wait(timeout)

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    # the thread ------------------------------------------------------------------

    def _run(self) -> None:
        retry = Reconnect(cap=self.max_backoff, window=float("inf"))
        lost = False
        while not self._stop.is_set():
            try:
                self._conn = connect(
                    self.url, autocommit=True, application_name=self.application_name
                )
                self._conn.execute(f"LISTEN {self.channel}")
                self.backend_pid = self._conn.info.backend_pid
            except Exception as exc:
                self._close()
                log.warning("listener cannot LISTEN on %s (%s); retrying", self.channel, exc)
                self._stop.wait(retry.next_pause())
                continue
            retry.reset()
            self._listening.set()
            if lost:
                self.reconnects += 1
                self._deliver(self.RECONNECTED)
            try:
                self._listen(self._conn)
            except Exception as exc:
                if self._stop.is_set():
                    break
                log.warning(
                    "listener connection lost (%s); reconnecting", lost_cause(self._conn, exc)
                )
                lost = True
            finally:
                self._listening.clear()
                self._close()

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        checked = time.monotonic()
        while not self._stop.is_set():
            for note in conn.notifies(timeout=self.poll_interval):
                if note.channel == self.channel:
                    self._deliver(note.payload)
                if self._stop.is_set():
                    return
            if time.monotonic() - checked >= self.health_interval:
                conn.execute("SELECT 1")
                checked = time.monotonic()

    def _deliver(self, payload: str) -> None:
        try:
            self.callback(payload)
        except Exception:
            log.exception("RunListener callback failed")

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
