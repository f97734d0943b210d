"""The HTTP server around the app: uvicorn, with bounds on slow and idle clients.

uvicorn closes a keep-alive connection idle between requests (``timeout_keep_alive``),
but not a connection that sends a request's head or body a byte at a time, nor one that
never sends anything: a few hundred such clients hold as many sockets (and, once the
head is in, the request's task) for as long as they like. :class:`GuardedProtocol` is
uvicorn's httptools protocol with four bounds of its own:

* a request's head must be complete within ``header_timeout`` seconds of its first byte
  (a new connection's clock starts when it opens): else 408 and the connection closes;
* its body within ``body_timeout`` seconds of the head: else the connection closes (the
  route sees the client gone; the answer, if any, has nowhere to go);
* a request's head may be at most ``max_head_bytes`` long (httptools sets no bound of
  its own: a head sent fast but without end would grow in memory until its timeout):
  else 431 and the connection closes;
* at most ``max_connections`` connections are open; one more is closed at once.

The clocks cost one float per phase on the request path; one sweep per server, a few
times a second and only while connections are open, closes what is overdue. A
connection whose reading the server paused (a pipelined request waiting its turn, a
body the app has not read) is not the client's delay: its clock restarts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agentledger.service._settings import ClientBounds

_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 40\r\nconnection: close\r\n\r\n"
    b"the request did not arrive within bounds"
)
_TOO_LARGE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
    b"charset=utf-8\r\ncontent-length: 36\r\nconnection: close\r\n\r\n"
    b"the request's head is over its bound"
)


class _Sweep:
    """Closes a server's overdue connections; runs while any connection is open."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any], every: float):
        self.loop, self.connections, self.every = loop, connections, every
        self.handle: asyncio.TimerHandle | None = None

    def ensure(self) -> None:
        if self.handle is None:
            self.handle = self.loop.call_later(self.every, self.run)

    def run(self) -> None:
        self.handle = None
        now = self.loop.time()
        for protocol in list(self.connections):
            overdue = getattr(protocol, "overdue", None)
            if overdue is not None:
                overdue(now)
        if self.connections:
            self.ensure()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded heads, bodies and connections."""

    bounds = ClientBounds()
    _deadline: float | None = None
    _in_head = False
    _head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.bounds.max_connections:
            transport.abort()
            return
        self._deadline = self.loop.time() + self.bounds.header_timeout
        state = self.server_state
        sweep = getattr(state, "agentledger_sweep", None)
        if sweep is None:
            every = min(
                1.0, max(0.05, min(self.bounds.header_timeout, self.bounds.body_timeout) / 4)
            )
            sweep = _Sweep(self.loop, self.connections, every)
            state.agentledger_sweep = sweep  # type: ignore[attr-defined]
        sweep.ensure()

    def data_received(self, data: bytes) -> None:
        # Bytes that arrive while a head is incomplete count towards it. The packet in
        # which a head begins is not counted (the count starts at that head's first
        # byte), so a head is cut off within one read of its bound.
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.bounds.max_head_bytes:
            self._cut_off(_TOO_LARGE_431)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._deadline = self.loop.time() + self.bounds.header_timeout

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._in_head = False
        self._deadline = self.loop.time() + self.bounds.body_timeout

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._deadline = None  # the request is in; between requests keep-alive rules

    def overdue(self, now: float) -> None:
        """Close this connection if its head or body is late (called by the sweep)."""
        deadline = self._deadline
        if deadline is None or now < deadline or self.transport.is_closing():
            return
        if self.flow is not None and self.flow.read_paused:  # we stopped reading, not them
            self._deadline = now + (
                self.bounds.header_timeout if self._in_head else self.bounds.body_timeout
            )
            return
        self._cut_off(_TIMEOUT_408 if self._in_head else None)

    def _cut_off(self, answer: bytes | None) -> None:
        """Close the connection, with ``answer`` unless a response is under way."""
        self._deadline = None
        if self.transport.is_closing():
            return
        if answer is not None and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(answer)
        self.transport.close()


def guarded_protocol(bounds: ClientBounds) -> type[GuardedProtocol]:
    """A :class:`GuardedProtocol` class with ``bounds`` (uvicorn makes one per connection)."""
    return type("GuardedProtocol", (GuardedProtocol,), {"bounds": bounds})


def uvicorn_config(
    app: Any, host: str, port: int, bounds: ClientBounds, log_level: str = "info"
) -> uvicorn.Config:
    """The uvicorn configuration ``serve`` runs ``app`` with."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=guarded_protocol(bounds),
        timeout_keep_alive=bounds.keep_alive,
    )
