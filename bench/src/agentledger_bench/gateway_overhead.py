"""Gateway overhead: the time a model call spends in our code, not in the provider.

    python -m agentledger_bench.gateway_overhead [--calls 300]

A fake Chat Completions server runs in its OWN process (the standard library's threaded
HTTP server, keep-alive) and reports its own time per request in ``X-Server-Time-Ms``.
The bench times, per call and after a warm-up:

* ``sdk``: the official ``openai`` SDK's ``chat.completions.create`` (``max_retries=0``)
  with the very parameters our code builds, minus the server's time: the floor (SDK,
  httpx, loopback) any gateway pays;
* ``model``: our ``OpenAIModel.complete`` (message and tool mapping, the SDK call,
  usage, pricing from genai-prices), minus the server's time;
* ``ours``: median(model) - median(sdk): the time in our code per call (target <= 2 ms).

The journal writes of a model step (reservation, answer) are store costs, measured by
the storage benches, not here. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TARGET_MS = 2.0

_ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4.1-mini",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"city": "Lisbon"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a client pool uses it
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle's algorithm and
    # the client's delayed ACK add ~40 ms to every answer, drowning what is measured.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:  # the stdlib calls it by this name
        started = time.perf_counter()
        length = int(self.headers.get("Content-Length", "0"))
        json.loads(self.rfile.read(length) or b"{}")
        body = json.dumps(_ANSWER).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        spent = (time.perf_counter() - started) * 1000
        self.send_header("X-Server-Time-Ms", f"{spent:.4f}")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet


def serve() -> None:
    """Run the fake server; print its port on stdout, then serve until killed."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


async def _measure(calls: int, port: int) -> dict[str, Any]:
    from agentledger.models._base import Message, ModelRequest, ToolSchema
    from agentledger.models._spec import model_from_string

    os.environ["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
    os.environ.setdefault("OPENAI_API_KEY", "bench-key")
    model: Any = model_from_string("openai:gpt-4.1-mini", environ={})
    client = model.client()
    server_ms: list[float] = []

    async def on_response(response: Any) -> None:
        server_ms.append(float(response.headers.get("x-server-time-ms", "0")))

    client._client.event_hooks = {"request": [], "response": [on_response]}
    tool = ToolSchema(
        name="lookup",
        description="Hotels in a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    )
    messages = [Message(role="system", content="Find hotels."), Message("user", "Lisbon?")]
    request = ModelRequest(messages=messages, tools=[tool], timeout=10.0)
    raw = model._params(request)  # the very request our code hands the SDK

    async def timed(fn: Any) -> list[float]:
        out = []
        for _ in range(calls // 5):
            started = time.perf_counter()
            await fn()
            total = (time.perf_counter() - started) * 1000
            out.append(total - server_ms[-1])
        return out

    for _ in range(30):  # warm-up: connections, imports, price tables
        await model.complete(request)
        await client.chat.completions.create(**raw)
    sdk: list[float] = []
    ours: list[float] = []
    for _ in range(5):  # interleaved rounds: machine noise falls on both alike
        sdk += await timed(lambda: client.chat.completions.create(**raw))
        ours += await timed(lambda: model.complete(request))
    await model.aclose()
    sdk_med, model_med = statistics.median(sdk), statistics.median(ours)
    ours_ms = round(model_med - sdk_med, 4)
    return {
        "bench": "gateway_overhead",
        "calls": calls,
        "server": "separate process (http.server, keep-alive)",
        "sdk_minus_server_ms_median": round(sdk_med, 4),
        "model_minus_server_ms_median": round(model_med, 4),
        "model_minus_server_ms_p95": round(sorted(ours)[int(0.95 * len(ours)) - 1], 4),
        "server_ms_median": round(statistics.median(server_ms), 4),
        "ours_ms_median": ours_ms,
        "target_ms": TARGET_MS,
        "within_target": ours_ms <= TARGET_MS,
    }


def main(argv: list[str] | None = None) -> None:
    """Start the fake server in its own process, measure, print JSON."""
    parser = argparse.ArgumentParser(prog="python -m agentledger_bench.gateway_overhead")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentledger_bench.gateway_overhead", "--serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())  # the server is listening once it prints
        print(json.dumps(asyncio.run(_measure(args.calls, port)), indent=2))
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


if __name__ == "__main__":
    main()
