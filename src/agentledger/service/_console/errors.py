"""What a console route raises instead of answering: a page in words (403, 404, 409,
410) or a redirect to sign in. Handled here so the API's problem+json handlers never
answer a person."""

from __future__ import annotations

import inspect
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentledger.service._console import render
from agentledger.service._console.headers import HEADERS, PREFIX


class PageError(Exception):
    """Answer with an error page: ``status``, a title and a sentence saying what to do."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


class SignInFirst(Exception):
    """No live session: send the person to the sign-in form, then back."""

    def __init__(self, back: str) -> None:
        super().__init__(back)
        self.back = back


def not_found(what: str) -> PageError:
    """The one answer for a missing id and another tenant's: nothing leaks."""
    return PageError(404, "Not found", f"There is no {what} here.")


async def _answer(given: Any) -> Any:
    """What another handler answered (Starlette lets a handler be sync or async)."""
    return await given if inspect.isawaitable(given) else given


def _is_console(request: Request) -> bool:
    path = request.url.path
    return path == PREFIX or path.startswith(PREFIX + "/")


def install(api: FastAPI) -> None:
    """Register the handlers on ``api`` (after the API's own: a request validation
    error or an HTTP error under ``/ui`` -- a parameter that is not a number, a method
    no console route takes -- is a page in words too; elsewhere the API's handler
    answers as before)."""
    api_invalid = api.exception_handlers[RequestValidationError]
    api_http = api.exception_handlers[StarletteHTTPException]
    api_crash = api.exception_handlers[Exception]

    @api.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Any:
        logged = await _answer(api_crash(request, exc))  # the API's: logs it, request id
        if not _is_console(request):
            return logged
        # Answered by the framework outside every middleware: the console's headers are
        # added here, or this one page would go out without its CSP.
        try:
            response = render.page(
                request, "error.html", status=500, title="Server error",
                message="Something went wrong on the server; it is in the server log. "
                "Reload the page, or try again later.",
            )  # fmt: skip
        except Exception:  # the page itself failed: the API's answer, with the headers
            response = logged
        for name, value in HEADERS:
            response.headers[name.decode()] = value.decode()
        return response

    @api.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        if not _is_console(request):
            return await _answer(api_invalid(request, exc))
        wrong = sorted({str(e.get("loc", ("", "?"))[-1]) for e in exc.errors()})
        return render.page(
            request, "error.html", status=400, title="Bad request",
            message=f"This page does not take that value of {', '.join(wrong)}; "
            "correct the address and try again.",
        )  # fmt: skip

    @api.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Any:
        if not _is_console(request):
            return await _answer(api_http(request, exc))
        words = {
            404: "There is no such page in the console.",
            405: "The console does not take that request here; use its pages and forms.",
        }
        response = render.page(
            request, "error.html", status=exc.status_code, title="Not possible",
            message=words.get(exc.status_code, "The console cannot answer that request."),
        )  # fmt: skip
        response.headers.update(dict(exc.headers or {}))
        return response

    @api.exception_handler(PageError)
    async def _page_error(request: Request, exc: PageError) -> HTMLResponse:
        return render.page(
            request, "error.html", status=exc.status, title=exc.title, message=exc.message
        )

    @api.exception_handler(SignInFirst)
    async def _sign_in(request: Request, exc: SignInFirst) -> Response:
        return RedirectResponse(f"/ui/signin?next={quote(exc.back, safe='/')}", status_code=303)
