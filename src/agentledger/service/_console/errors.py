"""What a console route raises instead of answering: a page in words (403, 404, 409,
410) or a redirect to sign in. Handled here so the API's problem+json handlers never
answer a person."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from agentledger.service._console import render


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


def install(api: FastAPI) -> None:
    """Register the handlers on ``api``."""

    @api.exception_handler(PageError)
    async def _page_error(request: Request, exc: PageError) -> HTMLResponse:
        return render.page(
            request, "error.html", status=exc.status, title=exc.title, message=exc.message
        )

    @api.exception_handler(SignInFirst)
    async def _sign_in(request: Request, exc: SignInFirst) -> Response:
        return RedirectResponse(f"/ui/signin?next={quote(exc.back, safe='/')}", status_code=303)
