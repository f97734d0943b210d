"""Fake OpenAI-compatible and Anthropic servers on a loopback port, scripted per test.

One uvicorn server (in a thread) serves ``POST /v1/chat/completions`` and
``POST /v1/messages``. Each request takes the next scripted :class:`Reply` (a default
text answer when the script is empty) and is recorded, so a test counts what the SDKs
really sent (and that they retried nothing on their own).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


@dataclass
class Reply:
    """One scripted answer: status, JSON body, headers, a delay, or SSE events."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    # JSON events (dicts) streamed as ``data:`` lines; a threading.Event among them holds
    # the stream there until it is set (tokens sent, the rest of the answer pending);
    # bytes among them are sent as they are (SSE comments, pings, malformed lines).
    sse: list[Any] | None = None
    hold: threading.Event | None = None  # answer only once set (a call in flight)
    # A Chat Completions stream ends with ``data: [DONE]`` unless this is False (the
    # connection then closes cleanly after the events, as a stream cut short does).
    done: bool = True
    # The connection breaks after the events (the body is never completed): a stream
    # dropped mid-answer after the provider processed the request.
    cut: bool = False
    # After the events the stream never ends: these bytes are sent again and again (a
    # provider that hangs mid-answer, keeping the connection alive) until the client leaves.
    endless: bytes | None = None


def openai_answer(
    text: str | None = None,
    calls: list[tuple[str, str]] = (),  # type: ignore[assignment]
    *,
    refusal: str | None = None,
    finish: str | None = None,
    usage: tuple[int, int, int] | None = (100, 20, 0),
    model: str = "gpt-4.1-mini",
) -> Reply:
    """A Chat Completions answer: text and/or tool calls (name, raw arguments); ``usage``
    None omits the usage object (as some compatible servers do)."""
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = tool_calls
    reason = finish or ("tool_calls" if tool_calls else "stop")
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
    }
    if usage is not None:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
            "prompt_tokens_details": {"cached_tokens": usage[2]},
        }
    return Reply(body=body)


def openai_stream(
    text_parts: list[str],
    usage: tuple[int, int] | None = (50, 10),
    *,
    finished: bool = True,
    cut: bool = False,
) -> Reply:
    """A streamed Chat Completions answer. ``usage`` None: no usage chunk;
    ``finished=False``: the text chunks only, then the connection closes cleanly (no
    finish reason, no ``[DONE]``); ``cut``: the connection breaks after the text chunks."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1-mini"}
    events: list[Any] = [
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": p}, "finish_reason": None}
            ],
        }
        for p in text_parts
    ]
    if not finished or cut:
        return Reply(sse=events, done=False, cut=cut)
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage is not None:
        events.append(
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage[0],
                    "completion_tokens": usage[1],
                    "total_tokens": sum(usage),
                },
            }
        )
    return Reply(sse=events)


def anthropic_answer(
    text: str | None = None,
    calls: list[tuple[str, dict[str, Any]]] = (),  # type: ignore[assignment]
    *,
    stop: str | None = None,
    usage: tuple[int, int, int] | None = (100, 20, 0),
    model: str = "claude-sonnet-4-5",
) -> Reply:
    """A Messages answer: text and/or tool_use blocks (name, input); ``usage`` None
    omits the usage object."""
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    for i, (name, args) in enumerate(calls):
        content.append({"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args})
    body: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop or ("tool_use" if calls else "end_turn"),
        "stop_sequence": None,
    }
    if usage is not None:
        body["usage"] = {
            "input_tokens": usage[0],
            "output_tokens": usage[1],
            "cache_read_input_tokens": usage[2],
            "cache_creation_input_tokens": 0,
        }
    return Reply(body=body)


def anthropic_stream(
    text_parts: list[str],
    usage: tuple[int, int] | None = (60, 12),
    *,
    finished: bool = True,
    cut: bool = False,
    calls: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> Reply:
    """A streamed Messages answer: one text block, its deltas, then the usage.
    ``usage`` None: no usage in any event; ``finished=False``: the text deltas only, then
    the connection closes cleanly (no ``message_delta``, no ``message_stop``); ``cut``: the
    connection breaks after the text deltas; ``calls`` (name, raw input JSON): tool_use
    blocks after the text, each input sent in two ``input_json_delta`` halves."""
    message: dict[str, Any] = {
        "id": "msg_s",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    if usage is not None:
        message["usage"] = {"input_tokens": usage[0], "output_tokens": 1}
    events: list[Any] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
        for p in text_parts
    ]
    for i, (name, raw) in enumerate(calls, start=1):
        block = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {}}
        half = len(raw) // 2
        events += [
            {"type": "content_block_stop", "index": i - 1},
            {"type": "content_block_start", "index": i, "content_block": block},
        ]
        events += [
            {
                "type": "content_block_delta",
                "index": i,
                "delta": {"type": "input_json_delta", "partial_json": part},
            }
            for part in (raw[:half], raw[half:])
        ]
    if not finished or cut:
        return Reply(sse=events, cut=cut)
    final: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None},
    }
    if usage is not None:
        final["usage"] = {"output_tokens": usage[1]}
    events += [{"type": "content_block_stop", "index": len(calls)}, final, {"type": "message_stop"}]
    return Reply(sse=events)


def error(status: int, message: str = "error", *, code: str | None = None, **headers: str) -> Reply:
    """An error answer in the providers' shape."""
    body = {"error": {"message": message, "type": "error", "code": code}}
    return Reply(
        status=status, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()}
    )


class StreamCut(Exception):
    """Raised inside a streamed body: the server drops the connection mid-answer."""


class FakeProviders:
    """The server: ``script(reply...)``, then read ``requests``."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.by_path: dict[str, deque[Reply]] = {}
        self.requests: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._handle)
        self.app.post("/v1/messages")(self._handle)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        config = uvicorn.Config(self.app, log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeProviders:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake provider server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self._sock.close()

    def reset(self) -> None:
        self.replies.clear()
        self.by_path.clear()
        self.requests.clear()

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def script_for(self, path: str, *replies: Reply) -> None:
        """Replies for one endpoint only, taken before the shared script: a request the
        client cut off before it reached the server shifts no other provider's answer."""
        self.by_path.setdefault(path, deque()).extend(replies)

    def wait_requests(self, n: int, timeout: float = 10.0) -> None:
        """Block until ``n`` requests arrived (a positive signal, not a sleep)."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.requests) >= n, timeout):
                raise AssertionError(f"expected {n} requests, got {len(self.requests)}")

    async def _handle(self, request: Request) -> Response:
        body = await request.json()
        own = self.by_path.get(request.url.path)
        if own:
            reply = own.popleft()
        else:
            reply = self.replies.popleft() if self.replies else self._default(request.url.path)
        with self.arrived:
            self.requests.append(
                {"path": request.url.path, "body": body, "headers": dict(request.headers)}
            )
            self.arrived.notify_all()
        if reply.hold is not None:
            await asyncio.to_thread(reply.hold.wait, 30)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.sse is not None:
            events, done, cut, endless = reply.sse, reply.done, reply.cut, reply.endless

            async def gen() -> Any:
                for e in events:
                    if isinstance(e, threading.Event):
                        await asyncio.to_thread(e.wait, 30)
                        continue
                    if isinstance(e, bytes):
                        yield e
                        continue
                    kind = e.get("type") if isinstance(e, dict) else None
                    prefix = f"event: {kind}\n" if kind and "/messages" in request.url.path else ""
                    yield f"{prefix}data: {json.dumps(e)}\n\n".encode()
                while endless is not None:
                    yield endless
                    await asyncio.sleep(0.01)
                if cut:  # the body is never completed: the client sees the connection drop
                    raise StreamCut("connection dropped mid-answer")
                if done and "/chat/" in request.url.path:
                    yield b"data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)

    @staticmethod
    def _default(path: str) -> Reply:
        return anthropic_answer("Done.") if path.endswith("/messages") else openai_answer("Done.")
