"""PostgreSQL: a journal commit never waits on the server's notification-queue lock, and
the events it wrote are still announced on ``agentledger_events``.

A transaction that NOTIFYs takes that one lock before its commit record and keeps it
until the commit is flushed (and, with a synchronous standby, acknowledged). Here a
session holds it: its commit inserts a row and notifies, and waits for a standby that
never comes (a private cluster, ``synchronous_standby_names`` set; the store's database
commits locally). Journal writes commit meanwhile; the notification of them arrives
once the lock is free."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg

from agentledger.store import open_store
from tests.pgcluster import PrivateCluster
from tests.store.test_contract import TARGET, batch, new_run, step

EVENTS_CHANNEL = "agentledger_events"


def _wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + 60
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


async def test_journal_commits_go_on_while_another_session_holds_the_notify_lock(
    pg_cluster: PrivateCluster,
) -> None:
    url = pg_cluster.create_database("notify_lock")
    with psycopg.connect(pg_cluster.admin_url, autocommit=True) as admin:
        admin.execute("ALTER DATABASE notify_lock SET synchronous_commit = local")
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        admin.execute("SELECT pg_reload_conf()")
    store = open_store(url)
    await store.open()
    listener = psycopg.connect(url, autocommit=True)
    holder = psycopg.connect(url)
    committing = threading.Thread(target=holder.commit, daemon=True)
    try:
        await store.create_run(new_run())
        (run,) = await store.claim_runs("w1", [TARGET], 1, 60)
        listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        holder.execute("SET synchronous_commit = remote_write")
        holder.execute("CREATE TABLE held (x int)")
        holder.execute("NOTIFY elsewhere")
        holder_pid = holder.info.backend_pid
        committing.start()  # takes the notify lock, then waits for the standby

        def holds_the_lock() -> bool:
            with psycopg.connect(url, autocommit=True) as c:
                row = c.execute(
                    "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (holder_pid,)
                ).fetchone()
            return row is not None and row[0] == "SyncRep"

        await asyncio.to_thread(_wait_for, holds_the_lock, "the holder's commit to wait")
        for n in (1, 2, 3):  # each a group of its own: the first, and the ones after it
            await asyncio.wait_for(store.commit(batch(run, steps=[step(run, n)])), 60)
        assert [s.step_no for s in await store.load_journal(run.id)] == [1, 2, 3]

        with psycopg.connect(url, autocommit=True) as c:  # the holder commits locally
            c.execute("SELECT pg_cancel_backend(%s)", (holder_pid,))
        await asyncio.to_thread(committing.join, 60)
        got = await asyncio.to_thread(lambda: list(listener.notifies(timeout=60, stop_after=1)))
        assert got and {n.channel for n in got} == {EVENTS_CHANNEL}
    finally:
        with psycopg.connect(pg_cluster.admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            )
        await store.close()
        listener.close()
        holder.close()
