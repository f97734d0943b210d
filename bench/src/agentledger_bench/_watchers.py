"""What watches a worker, in a process of its own: an OTLP/HTTP collector and a
``/metrics`` scraper.

A real collector and a real Prometheus run apart from the worker they watch. Run in the
measured process, their threads would take the interpreter lock from its event loop
(each export received, each scrape sent), a cost no deployment pays, charged to tracing.
"""

from __future__ import annotations

import multiprocessing
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["CollectorStub", "Watchers"]


class CollectorStub:
    """An OTLP/HTTP trace endpoint on loopback that accepts every export (counts requests
    and bytes; with ``keep_bodies``, keeps each request body too). Run by
    :class:`Watchers` in its own process; tests that read what was exported run it in
    theirs."""

    def __init__(self, keep_bodies: bool = False) -> None:
        stub = self
        self.requests = 0
        self.bytes = 0
        self.bodies: list[bytes] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stub.requests += 1
                stub.bytes += len(body)
                if keep_bodies:
                    stub.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _serve(conn: Connection, metrics_port: int, every: float) -> None:
    """The child: a collector that accepts every export, a scraper switched on and off
    by the parent; answers ``close`` with its counts."""
    counts = {"scrapes": 0, "scrape_errors": 0}
    collector = CollectorStub()
    on, stop = threading.Event(), threading.Event()
    url = f"http://127.0.0.1:{metrics_port}/metrics"

    def scrape() -> None:
        while not stop.wait(every):
            if on.is_set():
                try:
                    with urllib.request.urlopen(url, timeout=30) as reply:
                        reply.read()
                    counts["scrapes"] += 1
                except OSError:
                    counts["scrape_errors"] += 1

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    conn.send(collector.url)
    while (command := conn.recv()) != "close":
        (on.set if command == "on" else on.clear)()
    stop.set()
    scraper.join(timeout=35)
    collector.close()
    conn.send({**counts, "requests": collector.requests, "bytes": collector.bytes})


class Watchers:
    """The collector's URL (:attr:`url`), the scraper switched with :meth:`scrape`, the
    counts of both from :meth:`close`."""

    def __init__(self, metrics_port: int, every: float) -> None:
        self._conn, child = multiprocessing.get_context("spawn").Pipe()
        self._proc = multiprocessing.get_context("spawn").Process(
            target=_serve, args=(child, metrics_port, every), daemon=True
        )
        self._proc.start()
        child.close()
        self.url: str = self._conn.recv()
        self.counts: dict[str, int] = {}

    def scrape(self, on: bool) -> None:
        """Start or stop scraping ``/metrics`` (at once: no reply is awaited)."""
        self._conn.send("on" if on else "off")

    def close(self) -> dict[str, int]:
        """Stop both and return their counts. Blocks while the scraper's last request is
        answered: call it off the event loop that serves ``/metrics``."""
        self._conn.send("close")
        self.counts = self._conn.recv()
        self._proc.join(timeout=30)
        self._conn.close()
        return self.counts
