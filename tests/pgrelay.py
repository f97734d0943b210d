"""A TCP relay in front of PostgreSQL that can hold back chosen connections.

A worker pointed at the relay (:func:`via`) reaches the server through it. The
relay reads each connection's startup packet, so a test can delay the traffic of
one kind of connection -- e.g. a worker's lease heartbeats (its main connection,
``application_name=agentledger``) while its journal connection
(``agentledger:journal``) goes through. The URL it hands out disables TLS and GSS
encryption so the startup packet is readable.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

# Requests a client may send before its startup packet (answered by one byte).
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102


def via(url: str, host: str, port: int) -> str:
    """``url`` pointed at ``host:port``, with TLS and GSS encryption off."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    user = f"{netloc[0]}@" if len(netloc) == 2 else ""
    query = "&".join(p for p in (parts.query, "sslmode=disable&gssencmode=disable") if p)
    return urlunsplit(parts._replace(netloc=f"{user}{host}:{port}", query=query))


def _startup_params(packet: bytes) -> dict[str, str]:
    """The key/value pairs of a startup packet (length, protocol, then NUL-separated)."""
    fields = packet[8:].split(b"\0")
    pairs = zip(fields[::2], fields[1::2], strict=False)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs if k}


class _Connection:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.application_name: str | None = None
        self.open = threading.Event()  # cleared: traffic is held in both directions
        self.open.set()


class Relay:
    """A TCP relay: ``listen`` address -> ``target``, one thread pair per connection.

    ``hold(predicate)`` holds (does not forward, does not drop) the traffic of every
    connection whose ``application_name`` matches, current and future, until
    ``release()``.
    """

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.connections: list[_Connection] = []
        self._held: Callable[[str], bool] | None = None
        self._lock = threading.Lock()
        self.server = socket.create_server(listen)
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def hold(self, predicate: Callable[[str], bool]) -> None:
        """Hold the traffic of connections whose application_name matches."""
        with self._lock:
            self._held = predicate
            for conn in self.connections:
                self._apply(conn)

    def release(self) -> None:
        """Forward everything again (held bytes are delivered, in order)."""
        with self._lock:
            self._held = None
            for conn in self.connections:
                conn.open.set()

    def _apply(self, conn: _Connection) -> None:
        name = conn.application_name
        if self._held is not None and name is not None and self._held(name):
            conn.open.clear()
        else:
            conn.open.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            conn = _Connection(client, upstream)
            with self._lock:
                self.connections.append(conn)
            threading.Thread(target=self._from_client, args=(conn,), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(conn, upstream, client, b""), daemon=True
            ).start()

    def _from_client(self, conn: _Connection) -> None:
        """Forward the pre-startup requests and the startup packet, learn the name, pipe."""
        buffer = b""
        try:
            while True:
                while len(buffer) < 8:
                    data = conn.client.recv(65536)
                    if not data:
                        raise OSError("closed before startup")
                    buffer += data
                length, code = struct.unpack("!II", buffer[:8])
                while len(buffer) < length:
                    data = conn.client.recv(65536)
                    if not data:
                        raise OSError("closed in startup")
                    buffer += data
                packet, buffer = buffer[:length], buffer[length:]
                conn.upstream.sendall(packet)
                if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                    continue  # the server answers "N"; the real startup packet follows
                if code != _CANCEL_REQUEST:
                    name = _startup_params(packet).get("application_name", "")
                    with self._lock:
                        conn.application_name = name
                        self._apply(conn)
                break
        except OSError:
            self._close(conn)
            return
        self._pipe(conn, conn.client, conn.upstream, buffer)

    @staticmethod
    def _close(conn: _Connection) -> None:
        for s in (conn.client, conn.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _pipe(
        self, conn: _Connection, source: socket.socket, sink: socket.socket, pending: bytes
    ) -> None:
        try:
            if pending:
                conn.open.wait()
                sink.sendall(pending)
            while data := source.recv(65536):
                conn.open.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._close(conn)

    def close(self) -> None:
        self.server.close()
        with self._lock:
            for conn in self.connections:
                conn.open.set()
                for s in (conn.client, conn.upstream):
                    s.close()
