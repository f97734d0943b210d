"""Every PostgreSQL session of the store runs with the store's settings, whatever the
server's defaults: short statements, no transaction left idle, no JIT compilation; a
session the server ends is a lost connection that says why."""

from __future__ import annotations

import psycopg
import pytest

from agentledger.store import open_store
from agentledger.store._postgres import PostgresDialect
from agentledger.store._postgres.connection import connect
from agentledger.store._tx import Tx
from tests.engine.helpers import wait_for

SHOWN = ("statement_timeout", "idle_in_transaction_session_timeout", "jit")


def _settings(tx: Tx) -> dict[str, str]:
    return {name: tx.fetchall(f"SHOW {name}")[0][name] for name in SHOWN}


async def test_writer_and_read_connections_have_the_session_settings(pg_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    try:
        expected = {
            "statement_timeout": "30s",
            "idle_in_transaction_session_timeout": "10s",
            "jit": "off",
        }
        assert await store.transact(_settings) == expected
        assert await store.read(_settings) == expected
    finally:
        await store.close()


def test_a_server_default_of_jit_on_is_turned_off(pg_url: str) -> None:
    # As on a server whose configuration turns JIT on (PostgreSQL's own default).
    conn = connect(pg_url, options="-c jit=on")
    try:
        assert conn.execute("SHOW jit").fetchone() == {"jit": "off"}
    finally:
        conn.close()


@pytest.mark.parametrize("ended_by", ["idle-in-transaction timeout", "administrator command"])
def test_a_session_the_server_ends_is_a_lost_connection_that_says_why(
    pg_url: str, ended_by: str
) -> None:
    """Left idle inside its transaction (as by a frozen process), or terminated by an
    operator: the next statement fails as a lost connection (the store reconnects), and
    the line it logs names the server's reason, on one line."""
    conn = connect(pg_url)
    watch = psycopg.connect(pg_url, autocommit=True)
    try:
        if ended_by.startswith("idle"):
            # The store's own timeout, shortened for this session only.
            conn.execute("SET idle_in_transaction_session_timeout = '100ms'")
        conn.execute("SELECT 1 FROM runs LIMIT 1")  # a transaction is open, left idle
        pid = conn.info.backend_pid
        if not ended_by.startswith("idle"):
            watch.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(
            lambda: (
                not watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
            ),
            30,
            "the server to end the session",
        )
        with pytest.raises(psycopg.Error) as failed:
            conn.execute("SELECT 1")
            conn.commit()
        dialect = PostgresDialect(pg_url)
        assert dialect.is_disconnect(failed.value), failed.value
        cause = dialect.lost_cause(conn, failed.value)
        assert ended_by in cause and "\n" not in cause, cause
    finally:
        conn.close()
        watch.close()


def test_a_session_ended_while_its_client_was_frozen_says_why(pg_url: str) -> None:
    """The client sent a statement and froze (SIGSTOP) before reading the reply; the
    server answered, then ended the session idle in its transaction. Woken, the client
    reads the reply and the server's reason together (libpq hands the reason to the
    notice handler), and its next statement meets only a closed socket: the line the
    store logs still names the server's reason, on one line."""
    conn = connect(pg_url)
    watch = psycopg.connect(pg_url, autocommit=True)
    try:
        conn.execute("SET idle_in_transaction_session_timeout = '100ms'")  # this session
        pid = conn.info.backend_pid
        conn.pgconn.send_query(b"SELECT 1 FROM runs LIMIT 1")  # the reply is left unread
        wait_for(
            lambda: (
                not watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
            ),
            30,
            "the server to end the session",
        )
        conn.pgconn.consume_input()  # woken: the reply, then the server's last words
        while conn.pgconn.get_result() is not None:
            pass
        with pytest.raises(psycopg.Error) as failed:
            conn.commit()
        dialect = PostgresDialect(pg_url)
        assert dialect.is_disconnect(failed.value), failed.value
        assert dialect.lost_cause(conn, failed.value) == (
            "the server ended the session with 25P03: "
            "terminating connection due to idle-in-transaction timeout"
        )
    finally:
        conn.close()
        watch.close()
