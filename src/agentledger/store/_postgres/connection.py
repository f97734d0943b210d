"""PostgreSQL connections: session settings, placeholders, and clear connect errors.

The leaf of the PostgreSQL backend: the dialect, the async journal committer and the
LISTEN/NOTIFY listener all build on this module, and it imports none of them.
"""

from __future__ import annotations

import functools
import logging
import re
import weakref
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from agentledger._failures import cause_of
from agentledger.errors import StoreUnavailable
from agentledger.store._placeholders import TOKENS

log = logging.getLogger(__name__)

RUNS_CHANNEL = "agentledger_runs"
"""The LISTEN/NOTIFY channel that announces runnable runs."""

EVENTS_CHANNEL = "agentledger_events"
"""The channel on which every journal commit announces new events (no payload, so the
notifications of one transaction are delivered as one)."""

# The server's clock as UNIX seconds, one value for the whole statement: every lease
# and park decision is judged by it (Dialect.now_sql).
NOW_SQL = "EXTRACT(EPOCH FROM statement_timestamp())::float8"

STATEMENT_TIMEOUT = "30s"
# The store's transactions never wait on the client for long: whatever Python work runs
# inside one is short. A session idle in its transaction this long belongs to a process
# that is frozen (SIGSTOP, a stalled host) or lost: the server ends it, and with it the
# row locks it holds, so another worker can take over a run whose lease expired, and a
# renewal or a cancel waiting for that row goes on. 25P03 is a lost connection to the
# store (DISCONNECT_STATES): the worker, if it runs again, reconnects and finds its lease
# gone.
IDLE_IN_TRANSACTION_TIMEOUT = "10s"

# Every session of the store, in one round trip: short statements, no transaction
# left idle, synchronous_commit never "off" (a stronger server setting stays), and no
# JIT compilation. The store's statements are short index reads and writes, but on a
# large table the planner's cost estimate of a claim crosses jit_above_cost, and
# compiling the statement then costs more than running it, on every claim
# (docs/benchmarks.md).
SESSION_SETUP = (
    f"SELECT set_config('statement_timeout', '{STATEMENT_TIMEOUT}', false), "
    f"set_config('idle_in_transaction_session_timeout', '{IDLE_IN_TRANSACTION_TIMEOUT}', false), "
    "set_config('jit', 'off', false), "
    "CASE WHEN current_setting('synchronous_commit') = 'off' "
    "THEN set_config('synchronous_commit', 'on', false) END"
)

# Libpq settings applied unless the URL sets them itself.
CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "application_name": "agentledger",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}

# Advisory lock key that serializes schema migrations across processes
# (the bytes of "agentledg" would overflow; any fixed bigint will do).
MIGRATION_LOCK_KEY = 0x61676C6D  # "aglm"

# SQLSTATEs after which the session is gone: class 08 (connection exception) is
# matched by prefix; these are the server terminating or refusing the backend.
DISCONNECT_STATES = frozenset(
    {
        "57P01",  # admin_shutdown (pg_terminate_backend, fast shutdown)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, recovery)
        "57P05",  # idle_session_timeout
        "25P03",  # idle_in_transaction_session_timeout
    }
)


def _replace_token(match: re.Match[str]) -> str:
    name = match.group("name")
    if name is not None:
        return f"%({name})s"
    text = match.group(0)
    # psycopg parses every ``%`` of a query that has parameters, even inside quotes.
    return text.replace("%", "%%")


@functools.lru_cache(maxsize=2048)
def convert_placeholders(sql: str) -> str:
    """``:name`` -> ``%(name)s`` for psycopg; quotes, comments and ``::`` casts untouched.

    >>> convert_placeholders("SELECT a::text FROM t WHERE b = :b AND c LIKE 'x:%'")
    "SELECT a::text FROM t WHERE b = %(b)s AND c LIKE 'x:%%'"
    """
    return TOKENS.sub(_replace_token, sql)


def one_line(text: str, limit: int = 300) -> str:
    """Collapse a (multi-line) driver message into one short line."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def parse_url(url: str) -> dict[str, Any]:
    try:
        return dict(conninfo_to_dict(url))
    except psycopg.Error as exc:
        raise StoreUnavailable(
            f"invalid PostgreSQL URL ({one_line(str(exc))}); "
            "use postgresql://user:password@host:5432/dbname"
        ) from exc


def where_of(params: dict[str, Any]) -> str:
    """``host:port/dbname`` for messages (never the password)."""
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = str(params.get("port") or 5432)
    dbname = params.get("dbname") or params.get("user") or ""
    return f"{host}:{port}/{dbname}" if dbname else f"{host}:{port}"


# What the server said as it ended a session (its FATAL message: the idle-in-transaction
# timeout, pg_terminate_backend, a shutdown). Sent between two statements, libpq hands
# it to the notice handler, and the next statement meets only a closed socket
# ("server closed the connection unexpectedly"), which does not say why.
_farewells: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def keep_farewell(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Remember the server's last words on ``conn`` for :func:`lost_cause`."""
    ref = weakref.ref(conn)

    def notice(diag: psycopg.errors.Diagnostic) -> None:
        held = ref()
        if held is not None and diag.severity_nonlocalized in ("FATAL", "PANIC"):
            said = one_line(diag.message_primary or "")
            _farewells[held] = f"with {diag.sqlstate}: {said}"

    conn.add_notice_handler(notice)


def lost_cause(conn: Any, exc: BaseException) -> str:
    """Why ``conn`` was lost, in one line: what the server said as it ended the session,
    else the first line of ``exc`` (libpq's own messages run to several)."""
    said = _farewells.get(conn) if conn is not None else None
    return f"the server ended the session {said}" if said else cause_of(exc)


def connect(url: str, *, autocommit: bool = False, **overrides: Any) -> psycopg.Connection[Any]:
    """Open a psycopg connection with agentledger's session settings.

    Settings present in ``url`` win over :data:`CONNECT_DEFAULTS`; ``overrides``
    win over both. Raises :class:`StoreUnavailable` with a one-line message that
    says what to do when the server cannot be reached.
    """
    params = parse_url(url)
    extra = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in params}
    extra.update(overrides)
    try:
        conn: psycopg.Connection[Any] = psycopg.connect(
            url, autocommit=autocommit, row_factory=dict_row, **extra
        )
    except psycopg.Error as exc:
        raise connect_error(exc, params) from exc
    keep_farewell(conn)
    try:
        conn.execute(SESSION_SETUP)
        if not autocommit:
            conn.commit()
    except psycopg.Error as exc:
        conn.close()
        raise connect_error(exc, params) from exc
    return conn


def connect_error(exc: BaseException, params: dict[str, Any]) -> StoreUnavailable:
    """A one-line, actionable error for a failed connection attempt."""
    text = one_line(str(exc))
    where = where_of(params)
    dbname = params.get("dbname") or params.get("user") or "?"
    if f'database "{dbname}" does not exist' in text:
        return StoreUnavailable(
            f"PostgreSQL database {dbname!r} does not exist at {where} ({text}); "
            f"create it (createdb {dbname}) or check --db"
        )
    login = ("authentication failed", "no pg_hba.conf entry", "password", 'role "')
    if any(marker in text for marker in login):
        return StoreUnavailable(
            f"PostgreSQL at {where} rejected the login ({text}); "
            "check the user and password in --db"
        )
    return StoreUnavailable(
        f"cannot connect to PostgreSQL at {where} ({text}): is the server running? check --db"
    )
