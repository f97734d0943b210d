"""``POST /v1/runs`` without the framework's per-request machinery, for the common case.

A submit is the service's hot path: at 1,000 runs/s the ``serve`` process spends most
of its CPU in FastAPI's and Starlette's per-request layers (routing, the exception and
exit-stack middlewares, dependency solving, query parsing, request objects), not in the
submit. :class:`SubmitFastPath` answers a submit whose request is plain -- JSON body,
a valid key, a body the ``SubmitRun`` model accepts -- by calling the same endpoint
function (:func:`agentledger.service.routers.runs.submit_run`) with the same arguments
FastAPI would pass, and routes its errors through the app's own exception handlers.
Anything else (a missing or odd ``Content-Type``, a refused key, a body that does not
validate, dependency overrides, FastAPI's native telemetry being on) goes on to the
FastAPI route unchanged, with the body replayed: those answers stay FastAPI's own.
The route stays declared, so ``/openapi.json`` documents it as before.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from agentledger.service.auth import authenticate
from agentledger.service.problems import Problem
from agentledger.service.routers.runs import SubmitRun, submit_run

_PATH = "/v1/runs"
_JSON = b"application/json"


class SubmitFastPath:
    """ASGI middleware (inside :class:`~agentledger.service.problems.RequestMiddleware`,
    so requests have their id and the body limit applies) that serves plain submits."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != _PATH
            or scope["method"] != "POST"
            or "fastapi.telemetry" in scope  # spans want FastAPI's route: its path
        ):
            await self.app(scope, receive, send)
            return
        api = scope.get("app")
        if api is None or api.dependency_overrides or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        request = Request(scope, receive)
        try:
            # Through the body limit's receive: too large raises the 413 here.
            async for chunk in request.stream():
                chunks.append(chunk)
            body = b"".join(chunks)
            submit = await _plain_submit(request, body)
            if submit is None:
                await self.app(scope, _replay(body, receive), send)
                return
            response = await submit_run(submit[0], request, submit[1])
        except Exception as exc:
            handler = _handler(api, exc)
            if handler is None:
                raise  # as from a route: ServerErrorMiddleware answers (500 problem)
            response = await handler(request, exc)
        await response(scope, receive, send)


async def _plain_submit(request: Request, body: bytes) -> tuple[SubmitRun, Any] | None:
    """The validated body and the principal, or None when FastAPI should answer."""
    try:
        principal = await authenticate(request)
    except Problem:
        return None  # FastAPI's route refuses it the same way (and in its order)
    try:
        data = json.loads(body)
    except Exception:  # malformed JSON, bad UTF-8, too deep: FastAPI's 422 or 400
        return None
    if not isinstance(data, dict):
        return None
    try:
        return SubmitRun.model_validate(data), principal
    except ValidationError:
        return None  # FastAPI's 422, with its error locations


def _is_json(scope: Any) -> bool:
    seen = None
    for name, value in scope["headers"]:
        if name == b"content-type":
            if seen is not None:
                return False
            seen = value
    return seen == _JSON


def _replay(body: bytes, receive: Any) -> Any:
    """A receive that gives ``body`` once, then what the client sends (a disconnect)."""
    sent = False

    async def replayed() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _handler(api: Any, exc: Exception) -> Any:
    """The app's handler for ``exc`` as Starlette's ExceptionMiddleware picks it (status
    code first for HTTP exceptions, then the class's MRO); None for the catch-all one,
    which runs in ServerErrorMiddleware as it does for any route."""
    handlers = api.exception_handlers
    if isinstance(exc, StarletteHTTPException) and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
