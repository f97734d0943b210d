"""The chaos proxy: a reverse proxy on loopback in front of one HTTP provider.

``agentledger chaos --proxy NAME=URL`` starts one per NAME and hands its address to the
workers as ``AGENTLEDGER_CHAOS_PROXY_<NAME>`` (upper case, ``-`` and ``.`` as ``_``). It
forwards every request to URL and injects the faults of ``--faults`` whose endpoint is
NAME (:mod:`agentledger._chaos.faults`): before the provider (latency, rate limits, 5xx,
outages, 409 in progress, holds) or after it applied the request (a 5xx instead of its
answer, the answer held past the client's timeout, the connection closed without one).

It counts every write (POST, PUT, PATCH, DELETE) by its ``Idempotency-Key`` header: one
the provider answered 2xx is an effect, unless the provider said it replayed an earlier
answer (``Idempotent-Replayed: true``, as Stripe does) or answered exactly what it
answered that key before. A provider that ignores keys answers a new object (a new
payment id) to a resend, and so is counted twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from agentledger._chaos.counting import Effect
from agentledger._chaos.faults import Failure, FaultConfig, FaultInjector

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
KEY_HEADER = "idempotency-key"
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def env_name(name: str) -> str:
    """The environment variable that holds proxy ``name``'s address in the workers."""
    return "AGENTLEDGER_CHAOS_PROXY_" + name.upper().replace("-", "_").replace(".", "_")


@dataclass
class Exchange:
    """One write the proxy forwarded, and what the provider answered."""

    key: str | None
    method: str
    path: str
    arrived: float  # wall clock when the request reached the proxy
    status: int | None = None  # None: the provider never answered (unreachable)
    replayed: bool = False
    fault: str | None = None  # what the proxy did to its answer, if anything


@dataclass
class _State:
    name: str
    upstream: str
    injector: FaultInjector
    client: httpx.Client
    lock: threading.Lock = field(default_factory=threading.Lock)
    exchanges: list[Exchange] = field(default_factory=list)
    # The first 2xx answer per key (its digest): the same answer again is a replay.
    answers: dict[str, str] = field(default_factory=dict)
    saved_errors: dict[str, int] = field(default_factory=dict)
    requests: int = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the report says what happened."""

    def do_GET(self) -> None:
        self._proxy()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up waiting: its answer is lost, as intended
            self.close_connection = True

    def _failure(self, failure: Failure) -> None:
        import json

        body = json.dumps(failure.body).encode()
        self._send(
            failure.status_code, body, {"Content-Type": "application/json", **failure.headers}
        )

    def _proxy(self) -> None:
        # When the client sent it: a request held here was sent before anything that
        # happens during its hold.
        arrived = time.time()
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        method = self.command
        write = method in WRITE_METHODS
        key = self.headers.get(KEY_HEADER)
        name = state.name
        with state.lock:
            state.requests += 1
            delay = state.injector.latency(name)
            failure = state.injector.failure(name)
            if failure is None and write:
                failure = state.injector.in_progress(name)
            saved = state.saved_errors.get(key) if write and key else None
            hold = state.injector.hold_before(name) if failure is None and saved is None else 0
        if delay:
            time.sleep(delay)
        if failure is not None:
            self._failure(failure)
            return
        if saved is not None:
            self._failure(Failure(saved, {"error": "injected_error", "status": saved}))
            return
        if hold:
            time.sleep(hold)
        exchange = Exchange(key, method, self.path, arrived) if write else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        try:
            answer = state.client.request(
                method, state.upstream + self.path, content=body, headers=headers
            )
        except httpx.HTTPError as exc:
            if exchange is not None:
                with state.lock:
                    state.exchanges.append(exchange)
            self._failure(Failure(502, {"error": "chaos_proxy_upstream", "detail": str(exc)}))
            return
        reply_headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
        reply_headers.pop("content-encoding", None)
        content = answer.content
        after: tuple[int, bool] | None = None
        drop = False
        hold_after = 0.0
        with state.lock:
            if exchange is not None:
                exchange.status = answer.status_code
                exchange.replayed = _replayed(state, key, answer, content)
                after = state.injector.error_after_commit(name)
                if after is None:
                    drop = state.injector.drops(name)
                if after is None and not drop:
                    hold_after = state.injector.hold_after_commit(name)
                if after is not None:
                    exchange.fault = f"error_after_commit {after[0]}"
                    if after[1] and key:
                        state.saved_errors[key] = after[0]
                elif drop:
                    exchange.fault = "drop"
                elif hold_after:
                    exchange.fault = f"timeout_after_commit {hold_after:g}s"
                if exchange.fault:
                    state.injector.dropped(name)
                state.exchanges.append(exchange)
        if after is not None:
            self._failure(Failure(after[0], {"error": "injected_error", "status": after[0]}))
            return
        if drop:
            # The provider applied it; the client gets a closed connection, no answer.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)
            return
        if hold_after:
            time.sleep(hold_after)
        self._send(answer.status_code, content, reply_headers)


def _replayed(state: _State, key: str | None, answer: httpx.Response, content: bytes) -> bool:
    """Whether a 2xx answer to a write is the provider replaying an earlier one."""
    if not 200 <= answer.status_code < 300:
        return False
    if answer.headers.get("idempotent-replayed", "").lower() == "true":
        return True
    if key is None:
        return False
    digest = hashlib.sha256(content).hexdigest()
    first = state.answers.setdefault(key, digest)
    return first == digest and any(
        e.key == key and e.status is not None and 200 <= e.status < 300 for e in state.exchanges
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: _State

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a worker killed mid-request resets its connection, as chaos intends."""


class ChaosProxy:
    """One proxy NAME -> URL on 127.0.0.1 (a free port), serving on its own threads."""

    def __init__(self, name: str, upstream: str, faults: FaultConfig | None = None) -> None:
        self.name = name
        self.upstream = upstream.rstrip("/")
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = _State(
            name,
            self.upstream,
            FaultInjector(faults),
            httpx.Client(timeout=httpx.Timeout(60.0), follow_redirects=False),
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"chaos-proxy-{name}", daemon=True
        )

    @property
    def url(self) -> str:
        """The proxy's address, for the workers."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ChaosProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._server.state.client.close()

    def effects(self) -> list[Effect]:
        """Every write the provider applied anew (2xx, not a replay)."""
        state = self._server.state
        with state.lock:
            return [
                Effect(self.name, e.key, e.arrived, "proxy", f"{e.method} {e.path} -> {e.status}")
                for e in state.exchanges
                if e.status is not None and 200 <= e.status < 300 and not e.replayed
            ]

    def stats(self) -> dict[str, Any]:
        """Requests, writes, replays, answers withheld, and how often each fault fired."""
        state = self._server.state
        with state.lock:
            writes = list(state.exchanges)
            faults = state.injector.stats()
            requests = state.requests
        return {
            "requests": requests,
            "writes": len(writes),
            "writes_without_key": sum(1 for e in writes if e.key is None),
            "replays": sum(1 for e in writes if e.replayed),
            "answers_withheld": sum(1 for e in writes if e.fault),
            "faults": faults["fired"],
        }


@contextlib.contextmanager
def proxies(targets: dict[str, str], faults: FaultConfig | None) -> Iterator[dict[str, ChaosProxy]]:
    """Start one proxy per NAME -> URL; close them all on the way out."""
    started: dict[str, ChaosProxy] = {}
    try:
        for name, url in targets.items():
            started[name] = ChaosProxy(name, url, faults).start()
        yield started
    finally:
        for proxy in started.values():
            proxy.close()
