"""PostgreSQL-only behaviour: SKIP LOCKED claims across processes, connection
errors, LISTEN/NOTIFY wake-ups and surviving a terminated backend."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import psycopg
import pytest

from agentledger.errors import LeaseLost, StoreError, StoreUnavailable
from agentledger.records import Effect, Run, Step
from agentledger.store import Batch, EffectClaimed, NewRun, RunUpdate, Store, open_store
from agentledger.store._postgres import PostgresDialect, connect, convert_placeholders
from agentledger.store._postgres.listen import RunListener, notify_runs
from tests import dbutil
from tests.pgcluster import PrivateCluster

pytestmark = pytest.mark.postgres

TARGET = "agent@1"


def new_run() -> NewRun:
    return NewRun(kind="agent", name="agent", version="1", input={})


def step(run: Run, step_no: int) -> Step:
    return Step(
        run_id=run.id,
        step_no=step_no,
        kind="tool",
        name="t",
        status="succeeded",
        output={"n": step_no},
        idempotency_key=f"{run.id}:{step_no}",
        lease_epoch=run.lease_epoch,
    )


def batch(run: Run, /, **kw: object) -> Batch:
    assert run.lease_owner is not None
    return Batch(run_id=run.id, epoch=run.lease_epoch, owner=run.lease_owner, **kw)  # type: ignore[arg-type]


async def opened(url: str) -> Store:
    store = open_store(url)
    await store.open()
    return store


def wait_for(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


async def until(predicate: object, timeout: float = 10.0) -> bool:
    """Poll ``predicate`` from the event loop until it holds (False after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.02)
    return False


def lock_waiters(url: str) -> int:
    """Sessions on ``url``'s database waiting for a lock another session holds."""
    with connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row["n"]) if row else 0


# placeholders and error classification (no server needed) ----------------------


def test_placeholders_are_converted_outside_quotes_only() -> None:
    assert convert_placeholders("SELECT * FROM t WHERE a = :a AND b = :b_2") == (
        "SELECT * FROM t WHERE a = %(a)s AND b = %(b_2)s"
    )
    assert convert_placeholders("SELECT x::text, ':no' AS \"c:d\" FROM t WHERE y = :y") == (
        "SELECT x::text, ':no' AS \"c:d\" FROM t WHERE y = %(y)s"
    )
    assert convert_placeholders("SELECT 'it''s :x', 5 % 2 WHERE z LIKE 'a%' AND w=:w") == (
        "SELECT 'it''s :x', 5 %% 2 WHERE z LIKE 'a%%' AND w=%(w)s"
    )
    assert convert_placeholders("SELECT 1 -- :not_a_param\n, :p") == (
        "SELECT 1 -- :not_a_param\n, %(p)s"
    )


def test_disconnects_are_told_apart_from_other_errors() -> None:
    d = PostgresDialect("postgresql://h/db")
    assert d.is_disconnect(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert d.is_disconnect(psycopg.InterfaceError("the connection is closed"))
    assert d.is_disconnect(psycopg.errors.AdminShutdown("terminating connection"))
    assert d.is_disconnect(psycopg.errors.ConnectionFailure("gone"))
    assert not d.is_disconnect(psycopg.errors.DeadlockDetected("deadlock"))
    assert not d.is_disconnect(psycopg.errors.QueryCanceled("statement timeout"))
    assert not d.is_disconnect(psycopg.errors.UniqueViolation("dup"))
    assert not d.is_disconnect(ValueError("x"))
    assert d.is_transient(psycopg.errors.DeadlockDetected("deadlock"))
    assert isinstance(d.translate(psycopg.errors.AdminShutdown("bye")), StoreUnavailable)
    error = d.translate(psycopg.errors.SyntaxError("syntax error at\nline 2"))
    assert type(error) is StoreError and "\n" not in str(error)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://nohost:1/x", "cannot connect to PostgreSQL at nohost:1/x"),
        ("postgresql://127.0.0.1:1/x", "cannot connect to PostgreSQL at 127.0.0.1:1/x"),
        ("postgresql://h/x?nonsense=1", "invalid PostgreSQL URL"),
    ],
)
async def test_unreachable_server_fails_open_with_one_line(url: str, expected: str) -> None:
    store = open_store(url)
    with pytest.raises(StoreUnavailable) as info:
        await store.open()
    message = str(info.value)
    assert message.startswith(expected)
    assert "\n" not in message
    assert "check --db" in message or "use postgresql://" in message


async def test_unknown_database_and_role_say_what_to_do(pg_url: str) -> None:
    missing = dbutil.url_for("al_no_such_db")
    with pytest.raises(StoreUnavailable, match=r"does not exist.*createdb al_no_such_db") as info:
        await open_store(missing).open()
    assert "\n" not in str(info.value)
    with pytest.raises(StoreUnavailable, match="check the user"):
        parts = urlsplit(pg_url)
        connect(f"postgresql://al_no_such_role@{parts.hostname}:{parts.port or 5432}{parts.path}")


# claims across processes ---------------------------------------------------------------


async def test_concurrent_stores_claim_every_run_exactly_once(pg_url: str) -> None:
    stores = [await opened(pg_url) for _ in range(4)]
    try:
        await asyncio.gather(*(stores[i % 4].create_run(new_run()) for i in range(100)))

        async def drain(store: Store, owner: str) -> list[str]:
            claimed: list[str] = []
            while got := await store.claim_runs(owner, [TARGET], 3, 60):
                claimed += [r.id for r in got]
            return claimed

        results = await asyncio.gather(*(drain(s, f"w{i}") for i, s in enumerate(stores)))
        every = [run_id for claimed in results for run_id in claimed]
        assert len(every) == 100 and len(set(every)) == 100
        assert sum(1 for claimed in results if claimed) >= 2  # they really competed
        assert await stores[0].count_runs() == {"running": 100}
        runs = await stores[0].list_runs(limit=200)
        assert {r.lease_epoch for r in runs} == {1}
        owners = {run_id: f"w{i}" for i, claimed in enumerate(results) for run_id in claimed}
        assert all(r.lease_owner == owners[r.id] for r in runs)
        claims = Counter(e.run_id for e in await stores[0].list_events() if e.type == "run.claimed")
        assert set(claims.values()) == {1} and len(claims) == 100
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_effect_claimed_concurrently_by_another_process(pg_url: str) -> None:
    store = await opened(pg_url)
    try:
        await store.create_run(new_run())
        await store.create_run(new_run())
        first, second = await store.claim_runs("w1", [TARGET], 2, 60)
        # Another worker process claims the key and has not committed yet.
        other = psycopg.connect(pg_url)
        other.execute(
            "INSERT INTO effects (key, run_id, step_no, status, result, updated_at) "
            "VALUES ('pay:1', 'r-other', 5, 'claimed', 'null', 0)"
        )
        gate, busy = threading.Event(), threading.Event()

        def block(conn: object) -> bool:
            busy.set()
            return gate.wait(10)

        blocker = asyncio.ensure_future(store._call(block, write=False))
        assert await asyncio.to_thread(busy.wait, 10)  # the store's thread is taken
        racing = asyncio.ensure_future(
            store.commit(
                batch(
                    first,
                    steps=[step(first, 1)],
                    effects=[Effect(key="pay:1", run_id=first.id, step_no=1, status="claimed")],
                )
            )
        )
        bystander = asyncio.ensure_future(store.commit(batch(second, steps=[step(second, 1)])))
        assert await until(lambda: store._queue.qsize() >= 1)  # queued behind the blocker
        gate.set()
        await blocker
        # The racing batch now waits on the other process's uncommitted row.
        assert await until(lambda: lock_waiters(pg_url) >= 1)
        assert not racing.done()
        other.commit()
        other.close()
        with pytest.raises(EffectClaimed) as info:
            await racing
        assert info.value.effect.run_id == "r-other"
        await bystander  # the rest of the group committed
        assert [s.step_no for s in await store.load_journal(second.id)] == [1]
        assert await store.load_journal(first.id) == []
    finally:
        await store.close()


# surviving a lost connection ------------------------------------------------------------


async def test_writer_reconnects_after_its_backend_is_terminated(pg_url: str) -> None:
    url = dbutil.url_for(dbutil.dbname_of(pg_url), application_name="al_writer")
    store = await opened(url)
    try:
        await store.create_run(new_run())
        (run,) = await store.claim_runs("w1", [TARGET], 1, 60)
        await store.commit(batch(run, steps=[step(run, 1)], run=RunUpdate(step_count=1)))
        # Journal batches travel on their own connection (committed from the event loop).
        assert dbutil.terminate_backends(url, "al_writer:journal") == 1
        await store.commit(batch(run, steps=[step(run, 2)], run=RunUpdate(step_count=2)))
        assert [s.step_no for s in await store.load_journal(run.id)] == [1, 2]
        # Single (non-group) jobs survive it too.
        assert dbutil.terminate_backends(url, "al_writer") == 1
        got = await store.get_run(run.id)
        assert got is not None and got.step_count == 2
        # The fence still holds on the new connection.
        stale = Batch(run_id=run.id, epoch=run.lease_epoch - 1, owner="w1", steps=[step(run, 3)])
        with pytest.raises(LeaseLost):
            await store.commit(stale)
    finally:
        await store.close()


def test_run_listener_receives_notifications_and_reconnects(pg_url: str) -> None:
    got: queue.Queue[str] = queue.Queue()
    listener = RunListener(
        pg_url, got.put, poll_interval=0.1, health_interval=0.5, application_name="al_listener"
    )
    sender = connect(pg_url)
    listener.start()
    try:
        assert listener.wait_listening(10)
        notify_runs(sender)
        sender.commit()
        assert got.get(timeout=5) == ""
        notify_runs(sender, "run-1")
        sender.rollback()  # not delivered: the transaction did not commit
        notify_runs(sender, "run-2")
        sender.commit()
        assert got.get(timeout=5) == "run-2"

        assert dbutil.terminate_backends(pg_url, "al_listener") == 1
        assert wait_for(lambda: listener.reconnects == 1)
        assert got.get(timeout=5) == RunListener.RECONNECTED
        notify_runs(sender, "run-3")
        sender.commit()
        assert got.get(timeout=5) == "run-3"
        assert got.empty()
    finally:
        listener.stop()
        sender.close()
    assert not listener.listening


def test_run_listener_retries_until_the_server_is_there(
    pg_cluster: PrivateCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The listener starts while the server is down, keeps trying, and LISTENs once
    the server comes up (a private cluster, stopped and started by this test)."""
    pg_cluster.stop()
    got: queue.Queue[str] = queue.Queue()
    listener = RunListener(pg_cluster.admin_url, got.put, max_backoff=0.2, poll_interval=0.1)
    caplog.set_level(logging.WARNING, logger="agentledger.store._postgres.listen")

    def failed_attempts() -> int:
        return sum("cannot LISTEN" in r.getMessage() for r in caplog.records)

    listener.start()
    try:
        # It tried, failed, and tries on at its longest backoff while the server stays down.
        assert wait_for(lambda: failed_attempts() >= 6)
        assert not listener.listening
        pg_cluster.start()
        assert listener.wait_listening(10)
        with connect(pg_cluster.admin_url, autocommit=True) as sender:
            notify_runs(sender, "after-start")
        assert got.get(timeout=5) == "after-start"
    finally:
        listener.stop()
    assert listener.reconnects == 0  # a first connection, not a lost one


async def test_reapers_of_one_dead_owner_do_not_deadlock(pg_url: str) -> None:
    """Several workers expiring a dead worker's leases at once: no deadlock, all expired."""
    stores = [await opened(pg_url) for _ in range(4)]
    try:
        for _ in range(60):
            await stores[0].create_run(new_run())
        claimed = await stores[0].claim_runs("host:1:0:dead", [TARGET], 60, 600)
        assert len(claimed) == 60
        results = await asyncio.gather(
            *(s.expire_leases_of(["host:1:0:dead"]) for s in stores for _ in range(5))
        )
        assert sum(results) >= 60
        again = await stores[1].claim_runs("w2", [TARGET], 100, 60)
        assert len(again) == 60
    finally:
        for s in stores:
            await s.close()


async def test_heartbeats_and_group_commits_take_rows_in_one_order(pg_url: str) -> None:
    """A worker's heartbeat (writer connection) and its journal group commit (journal
    connection) lock many runs rows at once; in different orders they would deadlock."""

    def deadlocks() -> int:
        with connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            return int(row["deadlocks"]) if row else 0

    before = deadlocks()
    store = await opened(pg_url)
    try:
        for _ in range(40):
            await store.create_run(new_run())
        runs = await store.claim_runs("w1", [TARGET], 40, 600)
        leases = {r.id: r.lease_epoch for r in reversed(runs)}
        for round_no in range(15):
            batches = [
                batch(r, steps=[step(r, round_no + 1)], run=RunUpdate(step_count=round_no + 1))
                for r in (runs if round_no % 2 else list(reversed(runs)))
            ]
            outcomes = await asyncio.gather(
                store.renew_leases("w1", leases, 600),
                *(store.commit(b) for b in batches),
                return_exceptions=True,
            )
            assert [o for o in outcomes[1:] if o is not None] == []
            assert outcomes[0] == set()
    finally:
        await store.close()
    # Retries would hide a deadlock from the callers; the server's counter does not.
    assert deadlocks() == before


def backends_gone(url: str) -> bool:
    """No other session on ``url``'s database (a closed store's backends have exited,
    so what they counted in pg_stat_database is flushed)."""
    with connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
    return row is not None and int(row["n"]) == 0


def server_deadlocks(url: str) -> int:
    with connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row["deadlocks"]) if row else 0


def lay_out_backwards(url: str, ids: list[str]) -> None:
    """Write the rows again from the highest id down, each with a new entry in every
    index (an indexed column changes: no HOT update): the heap and the indexes' ties list
    the highest id first, so only an ORDER BY id reads them in id order."""
    with connect(url) as conn:
        for run_id in sorted(ids, reverse=True):
            conn.execute("UPDATE runs SET created_at = created_at + 0.001 WHERE id = %s", (run_id,))
        conn.commit()


async def test_a_renewal_locks_its_rows_in_id_order(pg_url: str) -> None:
    """While the renewal waits for a row another transaction holds, it holds exactly the
    rows of lower ids: it takes them one by one in id order (the order of the journal's
    group commits), whatever the order it was given or the rows lie in."""
    store = await opened(pg_url)
    holder = connect(pg_url)
    try:
        for _ in range(9):
            await store.create_run(new_run())
        runs = await store.claim_runs("w1", [TARGET], 9, 600)
        ids = sorted(r.id for r in runs)
        lay_out_backwards(pg_url, ids)
        middle = ids[4]
        holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (middle,))
        leases = {r.id: r.lease_epoch for r in sorted(runs, key=lambda r: r.id, reverse=True)}
        renewal = asyncio.ensure_future(store.renew_leases("w1", leases, 600))
        assert await until(lambda: lock_waiters(pg_url) == 1)
        with connect(pg_url, autocommit=True) as probe:
            free = probe.execute(
                "SELECT id FROM runs WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED", (ids,)
            ).fetchall()
        held_by_renewal = set(ids) - {r["id"] for r in free} - {middle}
        assert sorted(held_by_renewal) == ids[:4]
        holder.rollback()
        assert await renewal == set()
    finally:
        holder.close()
        await store.close()


async def test_two_heartbeats_and_a_writer_in_the_opposite_order_never_deadlock(
    pg_url: str,
) -> None:
    """Two workers' heartbeats wait behind a writer (a group commit, a release) that holds
    their lowest runs; the writer then takes their highest runs. A renewal that took rows
    above the one it waits for would hold them: a deadlock, one transaction rolled back.
    Taken in id order, the waiting renewals hold nothing and the writer goes through."""
    before = server_deadlocks(pg_url)
    first, second = await opened(pg_url), await opened(pg_url)
    writer = connect(pg_url)
    try:
        for _ in range(16):
            await first.create_run(new_run())
        mine = await first.claim_runs("w1", [TARGET], 8, 600)
        theirs = await second.claim_runs("w2", [TARGET], 8, 600)
        lay_out_backwards(pg_url, [r.id for r in [*mine, *theirs]])
        lowest = sorted([min(r.id for r in mine), min(r.id for r in theirs)])
        highest = sorted([max(r.id for r in mine), max(r.id for r in theirs)], reverse=True)
        writer.execute("SET lock_timeout = '60s'")
        for run_id in lowest:  # what a group commit's fences do, in id order
            writer.execute("UPDATE runs SET updated_at = updated_at WHERE id = %s", (run_id,))
        # Each heartbeat names its own runs and the other's (leases it lost), highest first.
        everyone = sorted([*mine, *theirs], key=lambda r: r.id, reverse=True)
        beats = [
            asyncio.ensure_future(
                store.renew_leases(owner, {r.id: r.lease_epoch for r in everyone}, 600)
            )
            for store, owner in ((first, "w1"), (second, "w2"))
        ]
        assert await until(lambda: lock_waiters(pg_url) == 2)
        for run_id in highest:  # the opposite order: would close a cycle
            writer.execute("UPDATE runs SET updated_at = updated_at WHERE id = %s", (run_id,))
        writer.commit()
        assert await beats[0] == {r.id for r in theirs}
        assert await beats[1] == {r.id for r in mine}
    finally:
        writer.close()
        await first.close()
        await second.close()
    # The store retries a deadlock and would hide it from the callers; the server counts it.
    assert await until(lambda: backends_gone(pg_url))
    assert server_deadlocks(pg_url) == before


async def test_a_renewal_waiting_on_a_lease_taken_over_meanwhile_reports_it_lost(
    pg_url: str,
) -> None:
    """The renewal waits on a row whose lease another transaction is taking over (a
    newer epoch, another owner); once that commits, the renewal re-reads the row: the
    run is lost and the new owner's lease is left as it was written."""
    store = await opened(pg_url)
    taker = connect(pg_url)
    try:
        for _ in range(3):
            await store.create_run(new_run())
        runs = sorted(await store.claim_runs("w1", [TARGET], 3, 600), key=lambda r: r.id)
        taken = runs[1]
        taker.execute(
            "UPDATE runs SET lease_owner = 'w2', lease_epoch = lease_epoch + 1, "
            "lease_expires_at = 12345 WHERE id = %s",
            (taken.id,),
        )
        renewal = asyncio.ensure_future(
            store.renew_leases("w1", {r.id: r.lease_epoch for r in runs}, 600)
        )
        assert await until(lambda: lock_waiters(pg_url) == 1)
        taker.commit()
        assert await renewal == {taken.id}
        now = await store.get_run(taken.id)
        assert now is not None and now.lease_owner == "w2" and now.lease_expires_at == 12345
        for run in (runs[0], runs[2]):
            kept = await store.get_run(run.id)
            assert kept is not None and kept.lease_expires_at is not None
            assert kept.lease_expires_at > time.time() + 500
    finally:
        taker.close()
        await store.close()


async def test_a_statement_libpq_refuses_to_send_is_an_error_not_a_lost_connection(
    pg_url: str,
) -> None:
    # Past 65,535 bind parameters libpq refuses the statement before sending it, with
    # no SQLSTATE and its connection intact: taken for a lost connection, it was retried
    # on a new one, failing the same way, for ever.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT 1 WHERE 1 IN (" + ",".join(["%s"] * 70_000) + ")", [1] * 70_000)
        assert info.value.sqlstate is None and not conn.broken
    d = PostgresDialect(pg_url)
    assert not d.is_disconnect(info.value)
    assert type(d.translate(info.value)) is StoreError
    store = open_store(pg_url)
    await store.open()
    try:
        marks = ",".join(f":p{i}" for i in range(70_000))
        params = {f"p{i}": i for i in range(70_000)}
        with pytest.raises(StoreError) as raised:
            await store.transact(lambda tx: tx.fetchall(f"SELECT 1 WHERE 1 IN ({marks})", params))
        assert type(raised.value) is StoreError, raised.value
        assert "number of parameters" in str(raised.value)
    finally:
        await store.close()


async def test_a_deadlock_is_retried_and_logged_on_one_line(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real deadlock between a store transaction and another session: the store's
    transaction is the victim, is run again and commits; its log line is one line
    (the server's message has DETAIL lines naming the processes)."""
    store = await opened(pg_url)
    holder = psycopg.connect(pg_url, autocommit=True)
    try:
        await store.transact(lambda tx: tx.execute("CREATE TABLE dl (id int PRIMARY KEY, v int)"))
        await store.transact(lambda tx: tx.execute("INSERT INTO dl VALUES (1, 0), (2, 0)"))
        holder.execute("SET deadlock_timeout = '60s'")  # the store's session detects it
        holder.execute("BEGIN")
        holder.execute("UPDATE dl SET v = v + 1 WHERE id = 2")
        took_one, attempts = threading.Event(), []

        def both_rows(tx: object) -> None:
            attempts.append(1)
            tx.execute("UPDATE dl SET v = v + 10 WHERE id = 1")  # type: ignore[attr-defined]
            took_one.set()
            tx.execute("UPDATE dl SET v = v + 10 WHERE id = 2")  # type: ignore[attr-defined]

        def the_other_order() -> None:
            took_one.wait(10)
            # The store's transaction holds row 1 and waits for row 2: this closes the cycle.
            holder.execute("UPDATE dl SET v = v + 1 WHERE id = 1")
            holder.execute("ROLLBACK")

        other = threading.Thread(target=the_other_order)
        other.start()
        with caplog.at_level(logging.INFO, logger="agentledger"):
            await store.transact(both_rows)
        other.join(10)
        rows = await store.transact(lambda tx: tx.fetchall("SELECT id, v FROM dl ORDER BY id"))
        assert [r["v"] for r in rows] == [10, 10]  # committed once, the holder's undone
        assert len(attempts) == 2
        lines = [r.getMessage() for r in caplog.records if "rolled back" in r.getMessage()]
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert "deadlock detected" in lines[0]
    finally:
        holder.close()
        await store.close()
