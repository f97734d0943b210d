"""Slow and idle clients are cut off by the server itself (issue 19, point 12): real
sockets on loopback trickle a request's head or body, or send nothing, and the server
closes them; each test waits for the close (EOF) under a generous outer bound."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from pathlib import Path

import httpx

from agentledger.service._settings import ClientBounds
from tests.service.conftest import mint, served, settings_for

OUTER = 30.0  # seconds: far past any bound below; reaching it is the failure
QUICK = ClientBounds(header_timeout=1.0, body_timeout=1.0)


def _connect(base_url: str) -> socket.socket:
    host, port = base_url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=OUTER)
    sock.setblocking(False)
    return sock


def _trickle_until_closed(
    socks: list[socket.socket], first: bytes, then: bytes, every: float = 0.2
) -> list[bytes]:
    """Send ``first`` on each socket, then one byte of ``then`` (repeated) every
    ``every`` seconds, until the server closes each; returns what each was answered.
    Fails if any is still open after OUTER seconds."""
    answers = {s: b"" for s in socks}
    open_ = set(socks)
    for s in socks:
        if first:
            s.sendall(first)
    give_up = time.monotonic() + OUTER
    sent = 0
    while open_:
        assert time.monotonic() < give_up, f"{len(open_)} of {len(socks)} still open"
        readable, _, _ = select.select(list(open_), [], [], every)
        for s in readable:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            answers[s] += data
            if not data:
                open_.discard(s)
        if then and not readable:
            byte = then[sent % len(then) : sent % len(then) + 1]
            sent += 1
            for s in list(open_):
                with contextlib.suppress(OSError):  # closed under us: recv sees it next
                    s.send(byte)
    for s in socks:
        s.close()
    return [answers[s] for s in socks]


def test_heads_trickled_a_line_at_a_time_are_cut_off_with_408(tmp_path: Path) -> None:
    settings = settings_for(f"sqlite:///{tmp_path / 'slow.db'}", client_bounds=QUICK)
    with served(settings) as srv:
        socks = [_connect(srv.base_url) for _ in range(60)]
        answers = _trickle_until_closed(socks, b"GET /healthz HTTP/1.1\r\n", b"X-Slow: y\r\n")
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[:3]
        # The server is still there for a client that sends its request at once.
        with httpx.Client(base_url=srv.base_url) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/healthz").status_code == 200  # kept alive


def test_connections_that_send_nothing_are_closed(tmp_path: Path) -> None:
    settings = settings_for(f"sqlite:///{tmp_path / 'idle.db'}", client_bounds=QUICK)
    with served(settings) as srv:
        socks = [_connect(srv.base_url) for _ in range(60)]
        assert _trickle_until_closed(socks, b"", b"") == [b""] * 60


async def test_a_body_trickled_a_byte_at_a_time_is_cut_off(tmp_path: Path) -> None:
    settings = settings_for(f"sqlite:///{tmp_path / 'body.db'}", client_bounds=QUICK)
    with served(settings) as srv:
        auth = (await mint(srv.app, "t1", "alice", ["operator"], 3600))["Authorization"]
        head = (
            "POST /v1/runs HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
            f"Authorization: {auth}\r\nContent-Length: 4000\r\n\r\n"
        ).encode()
        socks = [_connect(srv.base_url) for _ in range(5)]
        answers = _trickle_until_closed(socks, head + b'{"agent": "free", "input": "', b"x")
        # Closed without an answer: the route was still reading the body.
        assert answers == [b""] * 5


def test_connections_past_the_cap_are_closed_at_once(tmp_path: Path) -> None:
    bounds = ClientBounds(header_timeout=600, max_connections=3)
    settings = settings_for(f"sqlite:///{tmp_path / 'cap.db'}", client_bounds=bounds)
    with served(settings) as srv:
        held = [_connect(srv.base_url) for _ in range(3)]
        # Each held connection is accepted and answered: the server counts all three.
        for s in held:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")
        for s in held:
            assert select.select([s], [], [], OUTER)[0] and s.recv(65536).startswith(
                b"HTTP/1.1 200"
            )
        extra = _connect(srv.base_url)
        assert _trickle_until_closed([extra], b"", b"") == [b""]
        for s in held:
            s.close()


def test_a_head_past_its_size_bound_is_answered_431_and_closed(tmp_path: Path) -> None:
    """A head sent fast but without end is cut off by its size, not left to grow in
    memory until the head timeout; requests sent whole, a body of nearly the body limit
    and a run of pipelined heads in one packet, are answered as before."""
    bounds = ClientBounds(header_timeout=600, max_head_bytes=16 * 1024)  # only size ends it
    settings = settings_for(f"sqlite:///{tmp_path / 'head.db'}", client_bounds=bounds)
    with served(settings) as srv:
        host, port = srv.base_url.rsplit("/", 1)[1].split(":")
        sock = socket.create_connection((host, int(port)), timeout=OUTER)
        with contextlib.suppress(OSError):  # the server may close while we still send
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-Big: " + b"a" * (1 << 20))
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
        sock.close()
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]

        pipelined = _connect(srv.base_url)
        pipelined.setblocking(True)
        pipelined.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n" * 2000)
        seen = b""
        while seen.count(b"HTTP/1.1 200 ") < 2000:
            assert select.select([pipelined], [], [], OUTER)[0]
            chunk = pipelined.recv(1 << 20)
            assert chunk, seen.count(b"HTTP/1.1 200 ")
            seen += chunk
        pipelined.close()
        with httpx.Client(base_url=srv.base_url) as client:
            big = {"agent": "free", "input": {"text": "x" * (900 * 1024)}}
            assert client.post("/v1/runs", json=big).status_code == 401  # read whole, no key
