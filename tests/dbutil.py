"""Throw-away PostgreSQL databases for tests.

The server comes from ``AGENTLEDGER_TEST_PG`` (an admin URL; default
``postgresql://postgres@127.0.0.1:5432/postgres``). Each test gets a fresh
database ``al_test_<session>_<random>``, cloned from a template database
(``al_template_<session>``) that holds the migrated schema (``CREATE DATABASE ...
TEMPLATE``, a file copy: milliseconds). The template is built once per test
session and dropped at its end. Every name carries this session's tag
(:data:`SESSION`), so :func:`leftover_databases` finds what this session left on a
server other suites share -- and only that.
"""

from __future__ import annotations

import os
import queue
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

SESSION = secrets.token_hex(3)
"""This test session's tag, in the name of every database it creates."""
TEST_PREFIX = f"al_test_{SESSION}_"
TEMPLATE_NAME = f"al_template_{SESSION}"

_available: bool | None = None
_template: str | None = None


def admin_url() -> str:
    return os.environ.get("AGENTLEDGER_TEST_PG") or DEFAULT_ADMIN_URL


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(admin_url(), autocommit=True, connect_timeout=3)


def pg_available() -> bool:
    """True when the admin URL accepts a connection (checked once per session)."""
    global _available
    if _available is None:
        try:
            with _admin() as conn:
                conn.execute("SELECT 1")
            _available = True
        except psycopg.Error:
            _available = False
    return _available


def url_for(dbname: str, **query: str) -> str:
    """The admin URL pointed at another database (plus optional URL parameters)."""
    parts = urlsplit(admin_url())
    extra = "&".join(f"{k}={v}" for k, v in query.items())
    q = "&".join(p for p in (parts.query, extra) if p)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, q, ""))


def dbname_of(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _create(name: str, template: str | None) -> None:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    for attempt in range(3):
        try:
            with _admin() as conn:
                conn.execute(statement)
            return
        except psycopg.errors.ObjectInUse:
            # "source database is being accessed by other users": wait it out.
            if attempt == 2:
                raise
            time.sleep(0.5)


def _drop(name: str) -> None:
    with _admin() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def template_database() -> str:
    """The session's template database with the current schema (built on first use)."""
    global _template
    if _template is None:
        from agentledger.store._postgres import PostgresDialect
        from agentledger.store._queries import migrations
        from agentledger.store._tx import Tx

        name = TEMPLATE_NAME
        _create(name, None)
        dialect = PostgresDialect(url_for(name))
        conn = dialect.connect()
        try:
            migrations.migrate(Tx(dialect, conn))
        finally:
            conn.close()
        with _admin() as admin:  # nobody (not even autovacuum) may sit in the template
            admin.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name))
            )
        _template = name
    return _template


def drop_template() -> None:
    """Hand the session's template database (and the clone made ahead), if one was built,
    to the background drops: :func:`finish_drops` drops them together with the last tests'
    databases (each drop waits for a checkpoint; drops that run together share it)."""
    global _template
    spare = _spares.unused()
    if spare is not None:
        _dropper().put(spare)
    if _template is not None:
        _dropper().put(_template)
        _template = None


def make_pg_database(*, migrated: bool = True) -> str:
    """Create a fresh database and return its URL.

    ``migrated=True`` clones the session template (schema in place, as after a
    first ``store.open()``); ``migrated=False`` gives an empty database.
    """
    if migrated:
        return url_for(_spares.take())
    name = f"{TEST_PREFIX}{secrets.token_hex(6)}"
    _create(name, None)
    return url_for(name)


def _new_clone() -> str:
    name = f"{TEST_PREFIX}{secrets.token_hex(6)}"
    _create(name, template_database())
    return name


class _Spares:
    """Migrated clones made one ahead, in a thread: each test still gets a database no
    one has used, but its creation overlapped the test before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._next: Future[str] | None = None

    def take(self) -> str:
        with self._lock:
            ahead, self._next = self._next, None
            name = ahead.result() if ahead is not None else _new_clone()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clone-database")
            self._next = self._pool.submit(_new_clone)
            return name

    def unused(self) -> str | None:
        """The clone made ahead, once made, if any (the session is over: none is made
        after it)."""
        with self._lock:
            ahead, self._next = self._next, None
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
        return ahead.result() if ahead is not None else None


_spares = _Spares()


def drop_pg_database(url: str) -> None:
    """Drop a database made by :func:`make_pg_database`, closing its connections.

    The drop is handed to a background thread and the caller goes on: every ``DROP
    DATABASE`` makes the server take an immediate checkpoint and waits for it, a wait
    no test needs to sit through (each test has a database of its own, never reused).
    :func:`finish_drops` waits for every drop handed over.
    """
    _dropper().put(dbname_of(url))


DROP_BATCH = 8
"""Databases dropped together, once that many wait (and what is left at the end)."""


class _Dropper:
    """Drops the databases handed to it, in a daemon thread, :data:`DROP_BATCH` at once:
    drops that run together share their checkpoints (one at a time, each waits for its
    own)."""

    def __init__(self) -> None:
        self._names: queue.Queue[str | None] = queue.Queue()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._loop, name="drop-databases", daemon=True)
        self._thread.start()

    def put(self, name: str) -> None:
        self._names.put(name)

    def _loop(self) -> None:
        with ThreadPoolExecutor(max_workers=DROP_BATCH, thread_name_prefix="drop-db") as pool:
            finished = False
            while not finished:
                batch: list[str] = []
                while len(batch) < DROP_BATCH:
                    name = self._names.get()
                    if name is None:  # the session is over: drop what is left
                        finished = True
                        break
                    batch.append(name)
                for future in [pool.submit(_drop, n) for n in batch]:
                    try:
                        future.result()
                    except BaseException as exc:  # reported by finish(), not lost
                        self._errors.append(exc)

    def finish(self) -> None:
        self._names.put(None)
        self._thread.join()
        if self._errors:
            raise self._errors[0]


_dropping: _Dropper | None = None
_dropping_lock = threading.Lock()


def _dropper() -> _Dropper:
    global _dropping
    with _dropping_lock:
        if _dropping is None:
            _dropping = _Dropper()
        return _dropping


def finish_drops() -> None:
    """Wait until every database handed to :func:`drop_pg_database` is dropped (raises
    the first drop that failed)."""
    global _dropping
    with _dropping_lock:
        dropping, _dropping = _dropping, None
    if dropping is not None:
        dropping.finish()


def leftover_databases() -> list[str]:
    """Databases of this session still on the server (none once every test cleaned up)."""
    with _admin() as conn:
        found = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s OR datname = %s "
            "ORDER BY datname",
            [TEST_PREFIX.replace("_", r"\_") + "%", TEMPLATE_NAME],
        ).fetchall()
    return [str(row[0]) for row in found]


def drop_database(name: str) -> None:
    """Drop a database by name (closing its connections)."""
    _drop(name)


def terminate_backends(url: str, application_name: str | None = None) -> int:
    """``pg_terminate_backend`` every session on ``url``'s database (optionally one app's)."""
    query = (
        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid()"
    )
    params: list[str] = [dbname_of(url)]
    if application_name is not None:
        query += " AND application_name = %s"
        params.append(application_name)
    with _admin() as conn:
        row = conn.execute(query, params).fetchone()
    return int(str(row[0])) if row else 0
