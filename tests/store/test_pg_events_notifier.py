"""PostgreSQL: the events notifier's own connection is lost (terminated by the server,
a restart, a proxy); the commit after that is still announced on ``agentledger_events``.

A stream that waits on the notification (a long poll period) must not be left waiting
for the next commit, which may never come (the run's last event)."""

from __future__ import annotations

import asyncio
import time

import psycopg

from agentledger.store import open_store
from tests.store.test_contract import TARGET, batch, new_run, step

EVENTS_CHANNEL = "agentledger_events"
NOTIFIER_PIDS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND query LIKE 'SELECT pg_notify(%%'"
)


def _notified(listener: psycopg.Connection[object]) -> bool:
    return any(n.channel == EVENTS_CHANNEL for n in listener.notifies(timeout=60, stop_after=1))


def _terminate_notifier(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        (pid,) = admin.execute(NOTIFIER_PIDS).fetchone() or (None,)
        assert pid is not None, "the notifier's connection was not found"
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 60
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the notifier's connection did not end"
            time.sleep(0.02)


async def test_commit_after_the_notifier_connection_was_killed_is_announced(
    pg_url: str,
) -> None:
    store = open_store(pg_url)
    await store.open()
    listener = psycopg.connect(pg_url, autocommit=True)
    try:
        await store.create_run(new_run())
        (run,) = await store.claim_runs("w1", [TARGET], 1, 60)
        listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        await store.commit(batch(run, steps=[step(run, 1)]))
        assert await asyncio.to_thread(_notified, listener), "the first commit was not announced"

        await asyncio.to_thread(_terminate_notifier, pg_url)
        await store.commit(batch(run, steps=[step(run, 2)]))  # one commit, then none
        assert await asyncio.to_thread(_notified, listener), (
            "the commit after the notifier's connection was lost was never announced"
        )
    finally:
        await store.close()
        listener.close()


async def test_a_commit_just_before_the_store_closes_is_announced(pg_url: str) -> None:
    """A process that commits a run's last events and then stops (a one-shot run, a
    worker shutting down) still wakes the streams of other processes."""
    store = open_store(pg_url)
    await store.open()
    listener = psycopg.connect(pg_url, autocommit=True)
    try:
        await store.create_run(new_run())
        (run,) = await store.claim_runs("w1", [TARGET], 1, 60)
        listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        await store.commit(batch(run, steps=[step(run, 1)]))
        assert await asyncio.to_thread(_notified, listener), "the first commit was not announced"
        await store.commit(batch(run, steps=[step(run, 2)]))  # the last: the store closes
    finally:
        await store.close()
    try:
        assert await asyncio.to_thread(_notified, listener), (
            "the commit just before the store closed was never announced"
        )
    finally:
        listener.close()


async def test_closing_while_the_notifier_connection_is_opening_leaves_none_open(
    pg_url: str,
) -> None:
    """The notifier is opening its connection (a slow server) when the store closes:
    close sends the owed notification on that connection, opens no second one, and
    leaves none open."""
    from agentledger.store._postgres.async_commit import connect_async
    from agentledger.store._postgres.notifier import EventsNotifier

    gate = asyncio.Event()
    opened: list[psycopg.AsyncConnection[object]] = []
    calls: list[int] = []

    async def slow_connect() -> psycopg.AsyncConnection[object]:
        calls.append(1)
        await gate.wait()
        conn = await connect_async(pg_url, {})
        opened.append(conn)
        return conn

    listener = psycopg.connect(pg_url, autocommit=True)
    listener.execute(f"LISTEN {EVENTS_CHANNEL}")
    notifier = EventsNotifier(slow_connect)
    try:
        notifier.poke()
        while not calls:  # the sender is opening its connection
            await asyncio.sleep(0.01)
        closing = asyncio.ensure_future(notifier.close())
        sender = notifier._task
        assert sender is not None
        while not sender.done():  # close stopped the sender; it is on its own notification
            await asyncio.sleep(0.01)
        gate.set()
        await closing
        assert len(calls) == 1, "close opened a second connection beside the one opening"
        assert opened and all(c.closed for c in opened), "a connection was left open"
        assert await asyncio.to_thread(_notified, listener), "the owed commit was not announced"
    finally:
        gate.set()
        for conn in opened:
            await conn.close()
        listener.close()
