"""A loopback TCP proxy between a store and PostgreSQL that can lose a reply.

Armed with a trigger, it forwards the client's message holding the trigger (COMMIT,
or a statement that commits on its own), swallows the server's answer until a marker
shows the server finished it (the COMMIT's CommandComplete, or ReadyForQuery), then
drops both connections: the ambiguous COMMIT -- committed on the server, the reply
lost on the way back.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

COMMIT = b"COMMIT\x00"  # the statement alone (not "READ COMMITTED" in a BEGIN)
READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
COMMIT_DONE = b"COMMIT\x00"


class LossyProxy:
    """Forward 127.0.0.1:<port> to the server of ``url``; see :meth:`arm`."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._url = parts
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._trigger: bytes | None = None
        self._after: bytes | None = None
        self._marker = b""
        self.cut = threading.Event()  # set once a reply was lost
        self._closing = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """The same database, reached through the proxy, without TLS (so we can read)."""
        p = self._url
        netloc = f"{p.username}@" if p.username else ""
        if p.password:
            netloc = f"{p.username}:{p.password}@"
        query = "&".join(q for q in (p.query, "sslmode=disable") if q)
        return urlunsplit((p.scheme, f"{netloc}127.0.0.1:{self.port}", p.path, query, ""))

    def arm(self, trigger: bytes, marker: bytes = COMMIT_DONE, after: bytes | None = None) -> None:
        """Lose the reply to the next client message that contains ``trigger`` (with
        ``after``: the next one once a client message contained ``after``, e.g. the
        COMMIT of the transaction that sent it, not one of a store's opening)."""
        with self._lock:
            self.cut.clear()
            self._trigger, self._marker, self._after = trigger, marker, after

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        for s in self._sockets:
            s.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            state = {"cutting": False, "reply": b""}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                with self._lock:
                    if self._after is not None and self._after in data:
                        self._after = None  # the trigger may follow in the same chunk
                    if self._trigger is not None and self._after is None and self._trigger in data:
                        self._trigger = None
                        state["cutting"] = True
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            while data := server.recv(65536):
                if not state["cutting"]:
                    client.sendall(data)
                    continue
                state["reply"] += data  # the server answered: committed; never forwarded
                if self._marker in state["reply"]:
                    self.cut.set()
                    break
        except OSError:
            pass
        finally:
            _close(client, server)


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()
