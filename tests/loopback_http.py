"""A test HTTP server on a loopback port, in a thread: the receivers of webhook tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that does not log every request to stderr."""

    def log_message(self, format: str, *args: object) -> None:
        return


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler], path: str = "/hook") -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (a free port) until exit; yields the URL of ``path``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{path}"
    finally:
        server.shutdown()
        server.server_close()
