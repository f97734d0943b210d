"""``/ui/signin`` and ``/ui/signout``: a pasted API key becomes a session; signing out
revokes it."""

from __future__ import annotations

import hmac
import secrets

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from agentledger.service._console import render, sessions
from agentledger.service._console.errors import PageError, SignInFirst
from agentledger.service._problems import Problem

router = APIRouter(prefix="/ui", include_in_schema=False)
_SIGNIN_COOKIE = "agentledger_signin"


def _back(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if value and value.startswith("/ui/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/ui/runs"


async def signed_in(request: Request, *, touch: bool = True) -> sessions.Session:
    """The request's session; otherwise the person is sent to sign in (and back).
    ``touch=False``: the request is the page's own (a stream it opens, or opens again
    after a cut; a part it fetches on an event), not the person's, so it leaves the
    idle clock alone."""
    session = await sessions.current(request, touch=touch)
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


def _form_page(request: Request, back: str, error: str | None, status: int = 200) -> Response:
    """The sign-in form, with a fresh token in a field and in a cookie: a sign-in POST
    must carry both (another site's form cannot read the cookie to copy it), so no page
    elsewhere can sign a browser in under someone else's key."""
    token = secrets.token_urlsafe(24)
    response = render.page(request, "signin.html", status, back=back, error=error, token=token)
    response.set_cookie(
        _SIGNIN_COOKIE, token, max_age=3600, path="/ui/signin",
        secure=request.url.scheme == "https", httponly=True, samesite="strict",
    )  # fmt: skip
    return response


@router.get("/signin")
async def signin_form(request: Request, next: str | None = None) -> Response:
    return _form_page(request, _back(next), None)


@router.post("/signin")
async def signin(request: Request) -> Response:
    fields = await sessions.form(request)
    back = _back(fields.get("next"))
    expected = request.cookies.get(_SIGNIN_COOKIE, "")
    given = fields.get("token", "")
    if not (expected and hmac.compare_digest(expected.encode(), given.encode())):
        return _form_page(request, back, "The sign-in form had expired; paste the key again.", 403)
    key = fields.get("key", "").strip()
    if not key:
        return _form_page(request, back, "Paste an API key to sign in.", 400)
    response = RedirectResponse(back, status_code=303)
    try:
        await sessions.sign_in(request, response, key)
    except Problem as exc:
        return _form_page(request, back, f"That key does not sign in: {exc.detail}.", 401)
    # The new cookie replaces those the browser held: end their sessions too, so no
    # copy of one outlives the sign-in (a shared desk, another key).
    await sessions.end_held(request)
    response.delete_cookie(_SIGNIN_COOKIE, path="/ui/signin")
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    session, _ = await checked_form(request)
    response = RedirectResponse("/ui/signin", status_code=303)
    await sessions.sign_out(request, response, session)
    return response


# Included after every other console router: it takes what none of them does.
fallback = APIRouter(prefix="/ui", include_in_schema=False)


@fallback.get("/{rest:path}")
async def unknown_page(request: Request, rest: str) -> Response:
    """Any other path under /ui: a page saying so (the API's 404 is JSON)."""
    await signed_in(request)
    raise PageError(404, "Not found", "There is no such page in the console.")
