"""Deltas to other processes on PostgreSQL: NOTIFY on :data:`DELTA_CHANNEL`.

One relay per process and database: a thread with its own autocommit connection, apart
from the store's connections, so streaming tokens never queues behind journal writes.
The model call only appends to an in-memory queue (it never waits for the database).
The thread sends what piled up since its last send, deltas of the same step joined, in
order, each NOTIFY's text cut to :data:`CHUNK_CHARS` characters (PostgreSQL refuses a
payload of 8000 bytes or more; 1000 characters stay under it even when every character
is escaped in JSON).

Deltas are ephemeral: when the database cannot be reached they are dropped, never
retried (the journal's final message is what counts). An idle relay closes its
connection and its thread after :data:`IDLE_SECONDS`; the next delta opens them again.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
from typing import Any

log = logging.getLogger(__name__)

DELTA_EVENT = "model.delta"
#: The LISTEN/NOTIFY channel of deltas (one for all runs; the payload names the run).
DELTA_CHANNEL = "agentledger_deltas"
#: This process's mark on the deltas it sends to others (a process ignores its own).
ORIGIN = secrets.token_hex(8)

CHUNK_CHARS = 1000
IDLE_SECONDS = 5.0
_MAX_BATCH = 500  # deltas joined per round of sends


def payloads(events: list[dict[str, Any]]) -> list[str]:
    """The NOTIFY payloads of ``events``: consecutive deltas of one step's attempt joined,
    then cut into chunks small enough for one notification each."""
    joined: list[dict[str, Any]] = []
    for event in events:
        last = joined[-1] if joined else None
        if last and _of(last) == _of(event):
            last["text"] += event["text"]
        else:
            joined.append(dict(event))
    out = []
    for event in joined:
        text = event["text"]
        for start in range(0, max(len(text), 1), CHUNK_CHARS):
            part = {"o": ORIGIN, "r": event["run_id"], "s": event["step_no"]}
            part["a"] = event.get("attempt", 1)
            part["t"] = text[start : start + CHUNK_CHARS]
            out.append(json.dumps(part, ensure_ascii=False, separators=(",", ":")))
    return out


def _of(event: dict[str, Any]) -> tuple[Any, ...]:
    return event["run_id"], event["step_no"], event.get("attempt", 1)


def parse(payload: str) -> dict[str, Any] | None:
    """A delta event from a NOTIFY payload; None for one this process sent, or garbage."""
    try:
        data = json.loads(payload)
        if data["o"] == ORIGIN:
            return None
        return {
            "type": DELTA_EVENT,
            "run_id": str(data["r"]),
            "step_no": int(data["s"]),
            "attempt": int(data.get("a", 1)),
            "text": str(data["t"]),
        }
    except (ValueError, KeyError, TypeError):
        return None


class DeltaRelay:
    """Sends the deltas of this process to the other processes on one database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent = 0  # notifications sent (benchmarks and tests read it)
        self._queue: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def send(self, event: dict[str, Any]) -> None:
        """Queue a delta (returns at once); starts the thread if it is not running."""
        self._queue.put(event)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="agentledger-deltas", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        conn: Any = None
        try:
            while True:
                try:
                    first = self._queue.get(timeout=IDLE_SECONDS)
                except queue.Empty:
                    with self._lock:  # no send can slip in between this check and the exit
                        if self._queue.empty():
                            self._thread = None
                            return
                    continue
                batch = [first]
                while len(batch) < _MAX_BATCH:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                conn = self._notify(conn, payloads(batch))
        finally:
            if conn is not None:
                conn.close()

    def _notify(self, conn: Any, texts: list[str]) -> Any:
        """Send the payloads; on any failure drop them and the connection (ephemeral)."""
        from agentledger.store._postgres.connection import connect

        try:
            if conn is None:
                conn = connect(self.url, autocommit=True, application_name="agentledger-deltas")
            for text in texts:
                conn.execute("SELECT pg_notify(%s, %s)", (DELTA_CHANNEL, text))
                self.sent += 1
            return conn
        except Exception as exc:
            log.warning("model deltas not relayed (%s); the journal keeps the answer", exc)
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    log.debug("closing the delta connection failed", exc_info=True)
            return None


_relays: dict[str, DeltaRelay] = {}
_relays_lock = threading.Lock()


def relay_for(url: str) -> DeltaRelay:
    """The process's relay to the database at ``url``."""
    with _relays_lock:
        relay = _relays.get(url)
        if relay is None:
            relay = _relays[url] = DeltaRelay(url)
        return relay
