"""Every PostgreSQL session of the store runs with the store's settings, whatever the
server's defaults: short statements, no transaction left idle, no JIT compilation."""

from __future__ import annotations

from agentledger.store import open_store
from agentledger.store._postgres.connection import connect
from agentledger.store._tx import Tx

SHOWN = ("statement_timeout", "idle_in_transaction_session_timeout", "jit")


def _settings(tx: Tx) -> dict[str, str]:
    return {name: tx.fetchall(f"SHOW {name}")[0][name] for name in SHOWN}


async def test_writer_and_read_connections_have_the_session_settings(pg_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    try:
        expected = {
            "statement_timeout": "30s",
            "idle_in_transaction_session_timeout": "1min",
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
