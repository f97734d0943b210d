"""``/ui/signin`` and ``/ui/signout``: a pasted API key becomes a session; signing out
revokes it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from agentledger.service._console import render, sessions
from agentledger.service._console.errors import PageError, SignInFirst
from agentledger.service._problems import Problem

router = APIRouter(prefix="/ui", include_in_schema=False)


def _back(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if value and value.startswith("/ui/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/ui/runs"


async def signed_in(request: Request) -> sessions.Session:
    """The request's session; otherwise the person is sent to sign in (and back)."""
    session = await sessions.current(request)
    if session is None:
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise SignInFirst(back)
    request.state.console_session = session
    return session


async def checked_form(request: Request) -> tuple[sessions.Session, dict[str, str]]:
    """A state-changing POST's session and fields; 403 without this session's CSRF
    token (a form another site made cannot carry it)."""
    session = await signed_in(request)
    fields = await sessions.form(request)
    if not sessions.csrf_ok(session, fields):
        raise PageError(
            403,
            "Refused",
            "This form did not come from your console session (its security token is "
            "missing or wrong). Reload the page and try again.",
        )
    return session, fields


@router.get("")
async def home() -> Response:
    return RedirectResponse("/ui/runs", status_code=303)


@router.get("/signin")
async def signin_form(request: Request, next: str | None = None) -> HTMLResponse:
    return render.page(request, "signin.html", back=_back(next), error=None)


@router.post("/signin")
async def signin(request: Request) -> Response:
    fields = await sessions.form(request)
    back = _back(fields.get("next"))
    key = fields.get("key", "").strip()
    if not key:
        return render.page(
            request, "signin.html", status=400, back=back, error="Paste an API key to sign in."
        )
    response = RedirectResponse(back, status_code=303)
    try:
        await sessions.sign_in(request, response, key)
    except Problem as exc:
        return render.page(
            request, "signin.html", status=401, back=back,
            error=f"That key does not sign in: {exc.detail}.",
        )  # fmt: skip
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    session, _ = await checked_form(request)
    response = RedirectResponse("/ui/signin", status_code=303)
    await sessions.sign_out(request, response, session)
    return response
