"""ServiceAPI's front (service/_fastpath.py) against FastAPI's route at the edges:
request ids given, malformed or missing; the body limit by Content-Length and chunked;
a client gone mid-body; query strings; a trailing slash; other methods and scopes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agentledger.service._problems import MAX_BODY_BYTES
from tests.service.conftest import Api, in_process, settings_for

FAST = b"application/json"
ROUTED = b"application/json; charset=utf-8"


async def asgi(
    api: Api, method: str, path: str, headers: list[tuple[bytes, bytes]],
    chunks: list[bytes], query: bytes = b"", gone: bool = False,
) -> tuple[int, dict[bytes, bytes], bytes]:  # fmt: skip
    """One request to the app in process; with ``gone``, the last chunk says more is
    coming and the client is gone instead."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": query, "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 1), "server": ("api", 80),
    }  # fmt: skip
    pending = list(chunks) or [b""]
    start: dict[str, Any] = {}
    body: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": gone or bool(pending)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    await api.app(scope, receive, send)
    return start["status"], dict(start.get("headers", [])), b"".join(body)


def scrub(text: bytes) -> Any:
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    if isinstance(doc, dict):
        doc = {
            k: v
            for k, v in doc.items()
            if k not in {"request_id", "instance", "id", "created_at", "updated_at", "links"}
        }
    return doc


async def both(api: Api, method: str, path: str, extra: list[tuple[bytes, bytes]],
               chunks: list[bytes], query: bytes = b"") -> list[tuple[int, dict, Any]]:  # fmt: skip
    out = []
    for ct in (FAST, ROUTED):
        status, headers, body = await asgi(
            api, method, path, [(b"content-type", ct), *extra], chunks, query
        )
        out.append((status, headers, scrub(body)))
    return out


async def test_request_ids_given_malformed_and_missing(tmp_path: Path) -> None:
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'a.db'}")) as api:
        h = [(b"authorization", (await api.key())["Authorization"].encode())]
        good = [json.dumps({"agent": "echo", "input": {"text": "hi"}}).encode()]
        for given, kept in (
            (b"abc-1", True),
            (b"bad id!", False),
            (b"x" * 129, False),
            (None, False),
        ):
            extra = h + ([(b"x-request-id", given)] if given is not None else [])
            for status, headers, _ in await both(api, "POST", "/v1/runs", extra, good):
                assert status == 202
                rid = headers[b"x-request-id"]
                if kept:
                    assert rid == given
                else:
                    assert re.fullmatch(rb"req_[0-9a-f]{16}", rid), rid


async def test_the_body_limit_by_length_and_chunked(tmp_path: Path) -> None:
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'b.db'}")) as api:
        h = [(b"authorization", (await api.key())["Authorization"].encode())]
        big = json.dumps({"agent": "echo", "input": {"text": "x" * (MAX_BODY_BYTES + 10)}}).encode()
        declared = [(b"content-length", str(len(big)).encode())]
        fast, routed = await both(api, "POST", "/v1/runs", h + declared, [big])
        assert fast[0] == routed[0] == 413 and fast[2] == routed[2]
        chunked = [big[i : i + 65536] for i in range(0, len(big), 65536)]
        fast, routed = await both(api, "POST", "/v1/runs", h, chunked)
        assert fast[0] == routed[0] == 413 and fast[2] == routed[2]
        runs = await api.client.get("/v1/runs", headers={"Authorization": h[0][1].decode()})
        assert runs.status_code == 200 and not runs.json().get("runs", runs.json().get("items"))


async def test_query_string_trailing_slash_and_other_methods(tmp_path: Path) -> None:
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'c.db'}")) as api:
        h = [(b"authorization", (await api.key())["Authorization"].encode())]
        good = [json.dumps({"agent": "echo", "input": {"text": "hi"}}).encode()]
        fast, routed = await both(api, "POST", "/v1/runs", h, good, b"x=1&agent=nope")
        assert fast[0] == routed[0] == 202 and fast[2] == routed[2]
        fast, routed = await both(api, "POST", "/v1/runs/", h, good)
        assert fast[0] == routed[0] and fast[2] == routed[2]
        for method in ("HEAD", "OPTIONS", "PUT", "DELETE", "PATCH"):
            fast, routed = await both(api, method, "/v1/runs", h, good)
            assert fast[0] == routed[0] and fast[0] in (405, 200, 404), (method, fast)


async def test_a_client_gone_mid_body_is_the_routes_400_not_a_crash(tmp_path: Path) -> None:
    """The client disconnects before its body is complete. FastAPI's route answers 400
    ("There was an error parsing the body") and nothing reaches the server's error log;
    the front must not turn it into a 500 with the error raised to the server."""
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'd.db'}")) as api:
        h = [(b"authorization", (await api.key())["Authorization"].encode())]
        part = b'{"agent": "echo", "input": {"text": "'
        answers = []
        for ct in (FAST, ROUTED):
            chunks = [part]  # more_body stays True: the next receive is a disconnect
            scope_headers = [(b"content-type", ct), *h]
            try:
                status, _, body = await asgi(
                    api, "POST", "/v1/runs", scope_headers, chunks, gone=True
                )
            except Exception as exc:  # raised to the server: it logs a traceback
                answers.append(("raised", type(exc).__name__))
                continue
            answers.append((status, scrub(body)))
        assert answers[0] == answers[1], answers
        assert answers[1][0] == 400


async def test_lifespan_and_websocket_scopes_reach_the_app(tmp_path: Path) -> None:
    """ServiceAPI passes every scope but an HTTP POST /v1/runs on: the lifespan starts
    and stops the app (its store opened and closed); a websocket on /v1/runs is closed
    by the router, not taken for a submit."""
    from agentledger.service._app import create_app
    from tests.service import service_app

    app = create_app(settings_for(f"sqlite:///{tmp_path / 'l.db'}"), service_app.app)
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    assert [m["type"] for m in sent] == [
        "lifespan.startup.complete", "lifespan.shutdown.complete",
    ]  # fmt: skip

    sent.clear()
    ws_inbox = [{"type": "websocket.connect"}]

    async def ws_receive() -> dict[str, Any]:
        return ws_inbox.pop(0) if ws_inbox else {"type": "websocket.disconnect", "code": 1000}

    scope = {
        "type": "websocket", "asgi": {"version": "3.0"}, "path": "/v1/runs",
        "raw_path": b"/v1/runs", "query_string": b"", "root_path": "", "headers": [],
        "scheme": "ws", "client": ("127.0.0.1", 1), "server": ("api", 80), "subprotocols": [],
    }  # fmt: skip
    await app(scope, ws_receive, send)
    assert sent and sent[0]["type"] == "websocket.close", sent
