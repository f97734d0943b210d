"""``POST /v1/runs`` in front of the framework, for the common case.

A submit is the service's hot path: at 1,000 runs/s the ``serve`` process spends most
of its CPU in FastAPI's and Starlette's per-request layers (the error, telemetry and
body-limit middlewares, routing, the exception and exit-stack middlewares, dependency
solving, request objects), not in the submit. :class:`ServiceAPI` is the FastAPI app
with one difference: a ``POST /v1/runs`` goes first to :class:`SubmitFastPath`, in front
of the whole middleware stack (behind the service's own
:class:`~agentledger.service._problems.RequestMiddleware`, so it has its request id and
the body limit applies). It answers a submit whose request is plain -- JSON body, a
valid key, a body the ``SubmitRun`` model accepts -- by calling the same endpoint
function (:func:`agentledger.service._routers.runs.submit_run`) with the same arguments
FastAPI would pass, and routes its errors through the app's own exception handlers (an
unhandled one through the app's catch-all handler, as Starlette's
``ServerErrorMiddleware`` does, then raised for the server to log). Anything else (a
missing or odd ``Content-Type``, a refused key, a body that does not validate,
dependency overrides, a ``root_path``, FastAPI's native telemetry being on) goes to the
FastAPI app unchanged, with the body replayed: those answers stay FastAPI's own.
The route stays declared, so ``/openapi.json`` documents it as before.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from agentledger.service._auth import authenticate
from agentledger.service._problems import Problem, RequestMiddleware, body_limit
from agentledger.service._routers.runs import SubmitRun, submit_run

_PATH = "/v1/runs"
_JSON = b"application/json"


# How long a look at FastAPI's native telemetry holds: the look reads the global
# OpenTelemetry providers and the environment (about 20 us a request); a provider set
# while serving takes the submits to FastAPI's route within this many seconds.
_TELEMETRY_RECHECK = 1.0


class ServiceAPI(FastAPI):
    """The service's FastAPI app, with plain submits answered in front of its stack."""

    _front: Any = None
    _front_telemetry_on = False
    _front_telemetry_checked = -_TELEMETRY_RECHECK

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == _PATH
            and scope["method"] == "POST"
            and not self.root_path
            and not self.dependency_overrides
            and not self._front_steps_aside()
        ):
            front = self._front
            if front is None:
                front = self._front = RequestMiddleware(
                    SubmitFastPath(self._stack, self), body_limit(self)
                )
            scope["app"] = self
            await front(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _stack(self, scope: Any, receive: Any, send: Any) -> None:
        """What FastAPI does with any request (the submits the front passes on)."""
        await super().__call__(scope, receive, send)

    def _front_steps_aside(self) -> bool:
        """True when FastAPI's native telemetry would wrap this request: its spans want
        the route (and its path), so such submits take the route."""
        now = time.monotonic()
        if now - self._front_telemetry_checked >= _TELEMETRY_RECHECK:
            native = getattr(self, "_native_telemetry", None)  # FastAPI >= 0.165
            self._front_telemetry_on = native is not None and bool(native.enabled())
            self._front_telemetry_checked = now
        return self._front_telemetry_on


class SubmitFastPath:
    """The ASGI app in front of :class:`ServiceAPI`'s stack that serves plain submits;
    ``app`` (the stack) answers the others."""

    def __init__(self, app: Any, api: FastAPI) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        api = self.api
        if not _is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        request = Request(scope, receive)
        try:
            # Through the body limit's receive: too large raises the 413 here.
            body = await _read_body(request, chunks)
            submit = await _plain_submit(request, body)
            if submit is None:
                await self.app(scope, _replay(body, receive), send)
                return
            response = await submit_run(submit[0], request, submit[1])
        except Exception as exc:
            handler = _handler(api, exc)
            if handler is not None:
                response = await handler(request, exc)
            else:
                # As Starlette's ServerErrorMiddleware: the catch-all handler answers
                # (a 500 problem document), and the error goes on to the server's log.
                crash: Any = api.exception_handlers.get(500) or api.exception_handlers[Exception]
                response = await crash(request, exc)
                await response(scope, receive, send)
                raise
        await response(scope, receive, send)


async def _read_body(request: Request, chunks: list[bytes]) -> bytes:
    """The request's body, failing as FastAPI's route does when reading it fails: an
    HTTP error (the body limit's 413) as raised, anything else (the client gone before
    its body was complete) as the route's 400, answered, not a crash for the log."""
    try:
        async for chunk in request.stream():
            chunks.append(chunk)
    except StarletteHTTPException:
        raise
    except Exception as exc:
        raise StarletteHTTPException(400, "There was an error parsing the body") from exc
    return b"".join(chunks)


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
