"""A tiny payments provider over HTTP on loopback, for ``agentledger chaos``'s example.

``POST /charges`` with an ``Idempotency-Key`` header and ``{"order_id", "amount"}``
charges once per key: a second request with the key answers the first charge again with
``Idempotent-Replayed: true``, as Stripe does. ``GET /charges/{key}`` looks a charge up by
its key (404 ``not_found``). ``GET /ledger`` lists every charge. With ``ignore_keys`` it
charges every request anew, as a provider without idempotency keys does.

    python -m agentledger_examples.chaos_demo.provider --port 8765
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Ledger:
    def __init__(self, ignore_keys: bool) -> None:
        self.ignore_keys = ignore_keys
        self.lock = threading.Lock()
        self.charges: list[dict[str, Any]] = []
        self.by_key: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)

    def charge(self, key: str | None, order_id: str, amount: int) -> tuple[dict[str, Any], bool]:
        with self.lock:
            if key and not self.ignore_keys and key in self.by_key:
                return self.by_key[key], True
            charge = {"id": f"ch_{next(self.ids)}", "order_id": order_id, "amount": amount}
            charge["key"] = key
            self.charges.append(charge)
            if key:
                self.by_key.setdefault(key, charge)
            return charge, False


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path != "/charges":
            self._answer(404, {"error": "not_found"})
            return
        amount = body.get("amount")
        if not isinstance(amount, int) or amount <= 0:
            self._answer(400, {"error": "invalid_amount"})
            return
        charge, replayed = self.server.ledger.charge(
            self.headers.get("Idempotency-Key"), str(body.get("order_id")), amount
        )
        self._answer(200, charge, {"Idempotent-Replayed": "true"} if replayed else None)

    def do_GET(self) -> None:
        ledger = self.server.ledger
        if self.path == "/ledger":
            with ledger.lock:
                self._answer(200, {"charges": list(ledger.charges)})
            return
        if self.path.startswith("/charges/"):
            with ledger.lock:
                charge = ledger.by_key.get(self.path.removeprefix("/charges/"))
            if charge is None:
                self._answer(404, {"error": "not_found"})
            else:
                self._answer(200, charge)
            return
        self._answer(404, {"error": "not_found"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    ledger: _Ledger

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client killed mid-request resets its connection."""


class PaymentsProvider:
    """The provider on 127.0.0.1 (``port`` 0: a free one), served on its own threads."""

    def __init__(self, port: int = 0, ignore_keys: bool = False) -> None:
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.ledger = _Ledger(ignore_keys)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def charges(self) -> list[dict[str, Any]]:
        """Every charge made, in order."""
        with self._server.ledger.lock:
            return list(self._server.ledger.charges)

    def serve_forever(self) -> None:
        """Serve on this thread until interrupted."""
        self._server.serve_forever()

    def start(self) -> PaymentsProvider:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> PaymentsProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--ignore-keys", action="store_true", help="Charge every request anew.")
    args = parser.parse_args()
    provider = PaymentsProvider(args.port, args.ignore_keys)
    print(f"payments provider on {provider.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        provider.serve_forever()


if __name__ == "__main__":
    main()
