"""Console sessions: an API key pasted once becomes a server-side session.

The browser holds a random session id in a cookie (``HttpOnly``, ``SameSite=Strict``,
``Secure`` over https, ``Path=/ui``: the API's paths never receive it); the store holds
only its SHA-256, the key it was made with, the tenant, user and roles, a CSRF token, the
expiry and when the browser last made a request. Every request re-reads the session
(expiry is the server's, a logout revokes it) and the key (a revoked or expired key ends
its sessions), so a session never outlives what the key may do. A session also ends
after ``console_idle`` seconds without a request (an unattended browser); what a page
asks for by itself (a live stream, opened again after any cut; a part fetched on an
event) does not count as one, or a tab left open would keep it alive for ever.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qs

from fastapi import Request, Response

from agentledger.service._auth import Principal, check_key
from agentledger.service._queries import console as queries

COOKIE = "agentledger_console"
PATH = "/ui"  # the cookie goes with console requests only
_MAX_FORM = 64 * 1024  # a console form is a few fields
_TOUCH_EVERY = 30.0  # seconds: how stale the idle clock may be (a tenth of it at most)


@dataclass(frozen=True)
class Session:
    """A signed-in person: the principal its key gives, and the session's CSRF token."""

    id_hash: str
    principal: Principal
    csrf: str
    expires_at: float


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


async def sign_in(request: Request, response: Response, key: str) -> Session:
    """Check ``key`` as the API does (401 problem when it is not a live key), store a
    new session and set its cookie on ``response``."""
    app = request.app
    principal = await check_key(app, key)
    row = await app.state.keys.get(app.state.store, principal.key_id)
    now = time.time()
    lifetime = app.state.settings.console_lifetime
    expires_at = min(now + lifetime, float(row["expires_at"]) if row else now)
    session_id = secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(32)
    id_hash = _hash(session_id)
    await app.state.store.transact(
        queries.insert_session, id_hash, principal.key_id, principal.tenant_id,
        principal.user_id, sorted(principal.roles), csrf, now, expires_at,
    )  # fmt: skip
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=max(1, int(expires_at - now)),
        path=PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    _forget_root_cookie(response)
    return Session(id_hash, principal, csrf, expires_at)


def _forget_root_cookie(response: Response) -> None:
    """Expire a session cookie set with ``Path=/`` by an earlier version: a browser would
    send it beside the new one, and the server could read the old one first."""
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


def _named(request: Request) -> list[str]:
    """The distinct session ids the request's cookies name. A browser sends every cookie
    whose path fits, so a second one (an earlier version's ``Path=/``, or one planted
    from a sibling host) comes beside ours; a parser keeping one of the two would let
    that one decide whose session the request is."""
    found: list[str] = []
    for header in request.headers.getlist("cookie"):
        for part in header.split(";"):
            name, sep, value = part.strip().partition("=")
            value = value.strip().strip('"')
            if sep and name.strip() == COOKIE and value and value not in found:
                found.append(value)
    return found


async def end_held(request: Request) -> None:
    """End every session the request's cookies name (a sign-in replaces them all)."""
    now = time.time()
    for session_id in _named(request)[:8]:
        await request.app.state.store.transact(queries.revoke_session, _hash(session_id), now)


async def current(request: Request, *, touch: bool = True) -> Session | None:
    """The request's live session, or None (no cookie, two different ones, unknown,
    revoked, expired, idle too long, or its key revoked or expired). ``touch``: this
    request is the person's (a page, a form), so the idle clock starts again; an open
    stream looking at its session passes False."""
    named = _named(request)
    if len(named) != 1:
        return None
    session_id = named[0]
    if len(session_id) > 200:
        return None
    state = request.app.state
    row = await state.store.read(queries.get_session, _hash(session_id))
    now = time.time()
    if row is None or row["revoked_at"] is not None or row["expires_at"] <= now:
        return None
    seen = float(row["last_seen_at"] if row["last_seen_at"] is not None else row["created_at"])
    idle = state.settings.console_idle
    if now - seen >= idle:
        return None
    if touch and now - seen >= min(_TOUCH_EVERY, idle / 10):
        # Written at most every few seconds per session: a page's burst of requests (the
        # page, its assets' checks, a form) is one write, not one each.
        await state.store.transact(queries.touch_session, row["id_hash"], now)
    key = await state.keys.get(state.store, row["key_id"])
    if key is None or key["revoked_at"] is not None or key["expires_at"] <= now:
        return None
    # The key's roles as they are now (they never change today; if they ever do, the
    # session follows the key, not a copy made at sign-in).
    principal = Principal(row["key_id"], key["tenant_id"], key["user_id"], frozenset(key["roles"]))
    request.state.principal = principal
    return Session(row["id_hash"], principal, row["csrf"], float(row["expires_at"]))


async def sign_out(request: Request, response: Response, session: Session | None) -> None:
    """Revoke the session in the store and clear its cookie."""
    if session is not None:
        await request.app.state.store.transact(queries.revoke_session, session.id_hash, time.time())
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")
    _forget_root_cookie(response)


async def form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the first value of each); an oversized or undecodable
    body reads as no fields."""
    body = await request.body()
    if len(body) > _MAX_FORM:
        return {}
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, max_num_fields=50)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[0] for k, v in fields.items() if v}


def csrf_ok(session: Session, fields: dict[str, str]) -> bool:
    """True when the form carries this session's CSRF token (constant-time)."""
    given = fields.get("csrf", "")
    return bool(given) and hmac.compare_digest(given.encode(), session.csrf.encode())
