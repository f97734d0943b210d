"""RFC 9457 problem details: every error answer is ``application/problem+json`` with a
stable ``type`` URI per kind of error and the request id."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentledger._randomness import random_hex
from agentledger.errors import StoreUnavailable

log = logging.getLogger(__name__)
# One line per request (``serve --no-access-log`` quiets it): RequestMiddleware.
ACCESS_LOGGER = "agentledger.access"
_access = logging.getLogger(ACCESS_LOGGER)

TYPE_BASE = "https://agentledger.dev/problems/"
MEDIA_TYPE = "application/problem+json"

# kind -> (status, title). The kind is the last segment of the type URI and never changes.
KINDS: dict[str, tuple[int, str]] = {
    "bad-request": (400, "Bad request"),
    "invalid-idempotency-key": (400, "Malformed Idempotency-Key"),
    "unauthenticated": (401, "Missing or invalid API key"),
    "forbidden": (403, "Not allowed"),
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "idempotency-in-flight": (409, "A request with this Idempotency-Key is in flight"),
    "already-decided": (409, "Already decided"),
    "conflict": (409, "Conflict"),
    "resume-refused": (409, "Not resumed"),
    "resume-needs-force": (409, "Not resumed: it would re-execute confirmed effects"),
    "arguments-changed": (409, "The approval's arguments are not the ones decided on"),
    "expired": (410, "Expired"),
    "validation-error": (422, "Invalid request"),
    "webhook-refused": (422, "Webhook target not allowed"),
    "idempotency-key-reused": (422, "Idempotency-Key reused with a different body"),
    "payload-too-large": (413, "Request body too large"),
    "idempotency-key-required": (428, "Idempotency-Key required"),
    "quota-exceeded": (429, "Quota exceeded"),
    "internal": (500, "Internal error"),
    "unavailable": (503, "Service unavailable"),
}
_BY_STATUS = {
    400: "bad-request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "payload-too-large",
    422: "validation-error",
}

# The largest request body accepted (a run's input is a request, not a file upload);
# larger ones get 413 before they are buffered. A ServiceSettings may carry its own
# ``max_body_bytes``.
MAX_BODY_BYTES = 1024 * 1024


class Problem(Exception):
    """Raise to answer with a problem document."""

    def __init__(
        self,
        kind: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.status, self.title = KINDS[kind]
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra


def problem_response(
    request: Request,
    kind: str,
    detail: str,
    headers: dict[str, str] | None = None,
    status: int | None = None,
    **extra: Any,
) -> JSONResponse:
    """The problem+json answer for ``kind``."""
    default_status, title = KINDS[kind]
    status = status or default_status
    request_id = getattr(request.state, "request_id", None)
    body = {
        "type": TYPE_BASE + kind,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.url.path,
        "request_id": request_id,
        **extra,
    }
    out = dict(headers or {})
    if request_id:
        out["X-Request-Id"] = request_id
    return JSONResponse(body, status_code=status, headers=out, media_type=MEDIA_TYPE)


_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Set in a request's scope by the RequestMiddleware that gave it its id.
_ASSIGNED = "agentledger.request_id"


class RequestMiddleware:
    """The one middleware of the service, plain ASGI (no per-request task):

    * gives every request an id (``X-Request-Id``: the caller's if well formed), in
      ``request.state.request_id``, and echoes it on the response;
    * refuses request bodies over ``limit`` bytes with 413: by their Content-Length at
      once, else as soon as the streamed chunks pass it (nothing larger is buffered). It
      raises from ``receive``, inside the route, so the answer is a problem document;
    * logs one access line per request when it ends (logger ``agentledger.access``,
      INFO): method, path, status, milliseconds, request id, tenant and key id.

    One layer for both: each layer of the stack costs every request its calls. A request
    passes one of them however many are stacked (the submit fast path has its own in
    front of the app's, see ``service/_fastpath.py``)."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _ASSIGNED in scope:
            await self.app(scope, receive, send)
            return
        scope[_ASSIGNED] = True
        limit = self.limit
        given = ""
        declared = 0
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                given = value.decode("latin-1")
            elif name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
        rid = given if _REQUEST_ID.match(given) else "req_" + random_hex(8)
        scope.setdefault("state", {})["request_id"] = rid
        rid_header = (b"x-request-id", rid.encode())
        seen = 0

        def too_large() -> StarletteHTTPException:
            return StarletteHTTPException(
                413, f"request body larger than {limit} bytes", {"Connection": "close"}
            )

        async def limited() -> Any:
            nonlocal seen
            if declared > limit:
                raise too_large()
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large()
            return message

        status = 0

        async def send_with_id(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", ()) if h[0] != b"x-request-id"]
                headers.append(rid_header)
                message = {**message, "headers": headers}
            await send(message)

        started = time.perf_counter()
        try:
            await self.app(scope, limited, send_with_id)
        finally:
            if _access.isEnabledFor(logging.INFO):
                _log_access(scope, status, time.perf_counter() - started, rid)


def _log_access(scope: Any, status: int, seconds: float, rid: str) -> None:
    # The raw path: still percent-encoded, so a decoded newline cannot forge a line.
    path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")[:300]
    principal = scope.get("state", {}).get("principal")
    _access.info(
        "%s %s %s %.1f ms %s tenant %s key %s",
        scope["method"], path, status or "-", seconds * 1000, rid,
        getattr(principal, "tenant_id", "-"), getattr(principal, "key_id", "-"),
    )  # fmt: skip


def body_limit(app: FastAPI) -> int:
    """The largest request body ``app`` accepts, in bytes (its settings' or the default)."""
    settings = getattr(app.state, "settings", None)
    return int(getattr(settings, "max_body_bytes", MAX_BODY_BYTES))


def install(app: FastAPI) -> None:
    """Route every error -- ours, FastAPI's validation, Starlette's 404/405, crashes --
    through :func:`problem_response`; give requests their ids and refuse bodies over the
    size limit (413): :class:`RequestMiddleware`."""
    app.add_middleware(RequestMiddleware, limit=body_limit(app))

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(request, exc.kind, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        first = ".".join(errors[0]["loc"]) if errors else "request"
        return problem_response(
            request, "validation-error", f"{first}: {errors[0]['msg'] if errors else ''}",
            errors=errors,
        )  # fmt: skip

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = _BY_STATUS.get(exc.status_code, "bad-request")
        return problem_response(
            request, kind, str(exc.detail), dict(exc.headers or {}), status=exc.status_code
        )

    @app.exception_handler(StoreUnavailable)
    async def _unavailable(request: Request, exc: StoreUnavailable) -> JSONResponse:
        # Locked past the busy timeout, or reconnecting: nothing was committed, and the
        # same request (with its Idempotency-Key) may be sent again shortly.
        log.warning("store unavailable on %s: %s", request.url.path, exc)
        return problem_response(
            request,
            "unavailable",
            f"the database is busy or unreachable ({exc}); retry shortly",
            {"Retry-After": "1"},
        )

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return problem_response(request, "internal", "internal error; see the server log")


PROBLEM_SCHEMA: dict[str, Any] = {
    "description": "An RFC 9457 problem document",
    "content": {
        MEDIA_TYPE: {
            "schema": {
                "type": "object",
                "properties": {
                    "type": {"type": "string"},
                    "title": {"type": "string"},
                    "status": {"type": "integer"},
                    "detail": {"type": "string"},
                    "instance": {"type": "string"},
                    "request_id": {"type": "string"},
                },
                "required": ["type", "title", "status"],
            }
        }
    },
}
