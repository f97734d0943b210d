"""API keys and principals.

A key is ``al_<id>_<secret>``, sent as ``Authorization: Bearer <key>``. Only
HMAC-SHA256(pepper, id:secret) is stored; the pepper is the server's (env), so a copy
of the database alone cannot mint or check keys. Comparison is constant-time. Every
key has an expiry; a revoke takes effect within ``key_cache_seconds``.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from agentledger.service._problems import Problem
from agentledger.service._queries import keys as service_keys
from agentledger.store import Store

log = logging.getLogger("agentledger.service")

VIEWER, OPERATOR, APPROVER, ADMIN = "viewer", "operator", "approver", "admin"
# Reads deployment-wide figures (``/metrics``, every tenant's ``/v1/stats``). A tenant's
# admin does not hold it: only whoever mints keys (``agentledger keys create``, with
# the database and the pepper) can give it.
DEPLOYMENT = "deployment"
# Roles that only read: a key holding none but these starts and cancels no runs.
READ_ONLY_ROLES = frozenset({VIEWER, DEPLOYMENT})
_KEY = re.compile(r"^al_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
_ROLE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key, its tenant, user and roles."""

    key_id: str
    tenant_id: str
    user_id: str
    roles: frozenset[str] = field(default_factory=frozenset)

    def has(self, *roles: str) -> bool:
        """True when the principal holds any of ``roles`` (admin holds every one but
        ``deployment``: an admin's reach ends at its tenant)."""
        if self.roles.intersection(roles):
            return True
        return ADMIN in self.roles and any(r != DEPLOYMENT for r in roles)

    @property
    def acts(self) -> bool:
        """True when the key holds a role that acts (starts runs, cancels its user's
        own): any role but the read-only ones (``viewer``, ``deployment``)."""
        return bool(self.roles - READ_ONLY_ROLES)

    def as_dict(self) -> dict[str, Any]:
        """What a run records about the principal that started it."""
        return {
            "key_id": self.key_id,
            "tenant_id": self.tenant_id,
            "user_id": self.user_id,
            "roles": sorted(self.roles),
        }


@functools.lru_cache(maxsize=8)
def pepper_fingerprint(pepper: bytes) -> str:
    """What identifies a pepper in the store (``api_keys.pepper_id``) without giving it
    away: 16 hex digits of scrypt over it. Slow and memory-hard on purpose: the pepper
    may be as short as 16 characters, and a fast hash of a constant would let a copy of
    the database test guesses at it cheaply. Computed once per pepper per process."""
    derived = hashlib.scrypt(pepper, salt=_FINGERPRINT_SALT, n=2**14, r=8, p=1, dklen=8)
    return derived.hex()


_FINGERPRINT_SALT = b"agentledger api key pepper fingerprint v1"
_PEPPER_HELP = (
    "start `serve` with the AGENTLEDGER_KEY_PEPPER `agentledger keys create` had when it "
    "made them, or make new keys under this one"
)


async def warn_of_other_peppers(store: Store, pepper: bytes) -> None:
    """At ``serve`` start: log a warning when live keys in the store were made under
    another pepper (each such key answers 401 "unknown API key" here)."""
    try:
        counts = await store.read(service_keys.live_keys_by_pepper, time.time())
    except Exception as exc:  # a look at the keys never stops `serve` from starting
        log.warning("could not compare the API keys' peppers with this one: %s", exc)
        return
    ours = pepper_fingerprint(pepper)
    others = {p: n for p, n in counts.items() if p is not None and p != ours}
    if not others:
        return
    log.warning(
        "%d of %d API keys in the store were made under another AGENTLEDGER_KEY_PEPPER "
        "(fingerprint %s; this process's: %s): they answer 401 \"unknown API key\" here; %s",
        sum(others.values()), sum(counts.values()),
        ", ".join(f"{p} ({n} keys)" for p, n in sorted(others.items())), ours, _PEPPER_HELP,
    )  # fmt: skip


def hash_secret(pepper: bytes, key_id: str, secret: str) -> str:
    """The stored form of a key's secret."""
    return hmac.new(pepper, f"{key_id}:{secret}".encode(), hashlib.sha256).hexdigest()


def check_roles(roles: list[str]) -> list[str]:
    """Role names, validated (lowercase words); raises ValueError naming a bad one."""
    out = []
    for role in roles:
        role = role.strip()
        if not _ROLE.match(role):
            raise ValueError(f"{role!r} is not a role name (lowercase letters, digits, _.-)")
        out.append(role)
    if not out:
        raise ValueError("give at least one role, e.g. --roles operator")
    return out


async def create_key(
    store: Store,
    pepper: bytes,
    tenant_id: str,
    user_id: str,
    roles: list[str],
    expires_in: float,
) -> tuple[str, dict[str, Any]]:
    """Mint a key; returns (the full key, shown once; its listing row)."""
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(30)
    roles = check_roles(roles)
    expires_at = time.time() + expires_in
    await store.transact(
        service_keys.insert_key,
        key_id,
        tenant_id,
        user_id,
        roles,
        hash_secret(pepper, key_id, secret),
        secret[-4:],
        expires_at,
        pepper_fingerprint(pepper),
    )
    row = await store.read(service_keys.get_key, key_id)
    assert row is not None
    row.pop("secret_hash", None)
    return f"al_{key_id}_{secret}", row


class KeyCache:
    """Key rows by id, each kept ``ttl`` seconds (a revoke is seen within ``ttl``)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._rows: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def get(self, store: Store, key_id: str) -> dict[str, Any] | None:
        now = time.monotonic()
        cached = self._rows.get(key_id)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        row = await store.read(service_keys.get_key, key_id)
        if len(self._rows) > 10_000:
            self._rows.clear()
        self._rows[key_id] = (now, row)
        return row


_UNAUTHENTICATED = {"WWW-Authenticate": 'Bearer realm="agentledger"'}


async def authenticate(request: Request) -> Principal:
    """The caller's principal, from its bearer key; 401 problem otherwise."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(
            "unauthenticated",
            "send an API key as `Authorization: Bearer al_...`; create one with "
            "`agentledger keys create`",
            headers=_UNAUTHENTICATED,
        )
    principal = await check_key(request.app, token)
    request.state.principal = principal
    return principal


async def check_key(app: Any, token: str) -> Principal:
    """The principal of the API key ``token`` (``al_<id>_<secret>``) on ``app``; a 401
    problem when it is malformed, unknown, revoked or expired. The API's bearer keys and
    the console's sign-in both come through here."""
    state = app.state
    match = _KEY.match(token.strip())
    if match is None:
        raise Problem("unauthenticated", "malformed API key", headers=_UNAUTHENTICATED)
    key_id, secret = match.groups()
    row = await state.keys.get(state.store, key_id)
    expected = row["secret_hash"] if row else hash_secret(state.settings.pepper, "x", "y")
    given = hash_secret(state.settings.pepper, key_id, secret)
    valid = hmac.compare_digest(expected, given)
    if row is None or not valid:
        if row is not None:
            _other_pepper(row, state.settings.pepper)
        raise Problem("unauthenticated", "unknown API key", headers=_UNAUTHENTICATED)
    if row["revoked_at"] is not None:
        raise Problem("unauthenticated", "this API key was revoked", headers=_UNAUTHENTICATED)
    if row["expires_at"] <= time.time():
        raise Problem("unauthenticated", "this API key has expired", headers=_UNAUTHENTICATED)
    return Principal(key_id, row["tenant_id"], row["user_id"], frozenset(row["roles"]))


def _other_pepper(row: dict[str, Any], pepper: bytes) -> None:
    """Log why a key that exists answered 401 when the reason is its pepper."""
    made_under = row.get("pepper_id")
    ours = pepper_fingerprint(pepper)
    if made_under is not None and made_under != ours:
        log.warning(
            "401 unknown API key: key %s (tenant %s, user %s) was made under another "
            "AGENTLEDGER_KEY_PEPPER (fingerprint %s; this process's: %s); %s",
            row["id"], row["tenant_id"], row["user_id"], made_under, ours, _PEPPER_HELP,
        )  # fmt: skip


class _BearerKey(HTTPBearer):
    """The bearer scheme as one dependency: FastAPI documents it in the OpenAPI document
    (an ``HTTPBearer`` security scheme) and calling it resolves the principal. A second
    dependency only to declare the scheme would cost every request its solving."""

    async def __call__(self, request: Request) -> Principal:  # type: ignore[override]
        return await authenticate(request)


_BEARER = _BearerKey(
    scheme_name="HTTPBearer",
    auto_error=False,
    description="An API key: `Bearer al_<id>_<secret>`",
)

Caller = Annotated[Principal, Depends(_BEARER)]


def require(principal: Principal, *roles: str, action: str) -> None:
    """403 unless the principal holds one of ``roles``."""
    if not principal.has(*roles):
        raise Problem(
            "forbidden",
            f"{action} needs one of the roles {', '.join(roles)}; this key has "
            f"{', '.join(sorted(principal.roles)) or 'none'}",
        )
