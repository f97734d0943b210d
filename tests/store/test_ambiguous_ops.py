"""PostgreSQL: every store operation a worker or the API retries after a lost connection
answers as if the first attempt's reply had arrived -- the COMMIT reply is lost by the
proxy (the server committed), the store reconnects and runs the job again.

(Submits, claims, decisions and journal batches: test_ambiguous_commit.py.)"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from agentledger.records import Effect, OutboxItem, Run, WorkerInfo
from agentledger.store import Batch, NewRun, Store
from tests.store.pgproxy import COMMIT, LossyProxy

pytestmark = pytest.mark.postgres

TARGET = "agent@1"


@pytest.fixture
def store(proxied_store: Store) -> Store:
    """Every test here talks to PostgreSQL through the lossy proxy."""
    return proxied_store


def new_run(**kw: object) -> NewRun:
    return NewRun(kind="agent", name="agent", version="1", input={"q": 1}, **kw)  # type: ignore[arg-type]


async def claimed(store: Store, owner: str = "w1") -> Run:
    await store.create_run(new_run())
    (run,) = await store.claim_runs(owner, [TARGET], 1, 30)
    return run


async def test_append_event_whose_reply_is_lost_appends_one_event(
    store: Store, proxy: LossyProxy
) -> None:
    run = await store.create_run(new_run())
    proxy.arm(COMMIT)
    await store.append_event(run.id, "note", "ops", {"n": 1})
    assert proxy.cut.is_set()
    assert [e.type for e in await store.list_events(run.id)] == ["run.submitted", "note"]


async def test_expire_leases_whose_reply_is_lost_reports_what_it_expired(
    store: Store, proxy: LossyProxy
) -> None:
    run = await claimed(store, "dead")
    proxy.arm(COMMIT)
    assert await store.expire_leases_of(["dead"]) == 1
    assert proxy.cut.is_set()
    got = await store.get_run(run.id)
    assert got is not None and got.lease_expires_at == 0


async def test_outbox_claim_whose_reply_is_lost_returns_the_rows_it_leased(
    store: Store, proxy: LossyProxy
) -> None:
    run = await claimed(store)
    item = OutboxItem(key="mail:1", run_id=run.id, step_no=1, tool="email", payload={})
    await store.commit(Batch(run.id, run.lease_epoch, "w1", outbox=[item]))
    proxy.arm(COMMIT)
    (got,) = await store.claim_outbox("d1", 10, 30)
    assert proxy.cut.is_set()
    assert got.key == "mail:1" and got.lease_owner == "d1" and got.claim_epoch == 1
    (row,) = await store.list_outbox()
    assert row.claim_epoch == 1  # leased once, not twice
    got.status, got.attempts = "delivered", 1
    assert await store.settle_outbox(got)


async def test_outbox_settle_whose_reply_is_lost_is_reported_settled(
    store: Store, proxy: LossyProxy
) -> None:
    run = await claimed(store)
    item = OutboxItem(key="mail:1", run_id=run.id, step_no=1, tool="email", payload={})
    await store.commit(Batch(run.id, run.lease_epoch, "w1", outbox=[item]))
    (got,) = await store.claim_outbox("d1", 10, 30)
    got.status, got.attempts = "delivered", 1
    proxy.arm(COMMIT)
    assert await store.settle_outbox(got)
    assert proxy.cut.is_set()
    assert [o.status for o in await store.list_outbox()] == ["delivered"]


async def test_release_whose_reply_is_lost_is_reported_released(
    store: Store, proxy: LossyProxy
) -> None:
    run = await claimed(store)
    proxy.arm(COMMIT)
    assert await store.release_run(run.id, run.lease_epoch, "w1") is True
    assert proxy.cut.is_set()
    got = await store.get_run(run.id)
    assert got is not None and got.status == "queued" and got.lease_owner is None
    assert [e.type for e in await store.list_events(run.id)].count("run.released") == 1


async def test_cancel_whose_reply_is_lost_requests_once(store: Store, proxy: LossyProxy) -> None:
    run = await claimed(store)
    proxy.arm(COMMIT)
    got = await store.cancel_run(run.id, "user asked", "alice")
    assert proxy.cut.is_set()
    assert got.cancel_requested == "user asked" and got.status == "running"
    assert [e.type for e in await store.list_events(run.id)].count("run.cancel_requested") == 1


async def test_renew_whose_reply_is_lost_loses_no_lease(store: Store, proxy: LossyProxy) -> None:
    run = await claimed(store)
    proxy.arm(COMMIT)
    assert await store.renew_leases("w1", {run.id: run.lease_epoch}, 60) == set()
    assert proxy.cut.is_set()


async def test_worker_registration_and_heartbeat_whose_reply_is_lost(
    store: Store, proxy: LossyProxy
) -> None:
    info = WorkerInfo(id="w1", host="h", pid=1, targets=[TARGET], started_at=0, heartbeat_at=0)
    proxy.arm(COMMIT)
    await store.register_worker(info, {TARGET: "agent"})
    assert proxy.cut.is_set()
    proxy.arm(COMMIT)
    await store.heartbeat_worker("w1")
    assert proxy.cut.is_set()
    assert [w.id for w in await store.list_workers(live_within=60)] == ["w1"]
    assert [r["target"] for r in await store.registrations()] == [TARGET]


async def test_swap_effect_whose_reply_is_lost_is_reported_written(
    store: Store, proxy: LossyProxy
) -> None:
    run = await claimed(store)
    effect = Effect(key="fx", run_id=run.id, step_no=1, status="claimed", result={"a": "\x00"})
    proxy.arm(COMMIT)
    written, current = await store.swap_effect(effect, None)
    assert proxy.cut.is_set()
    assert written and current is not None and current.status == "claimed"
    done = Effect(key="fx", run_id=run.id, step_no=1, status="done", result={"ok": "\ud800"})
    proxy.arm(COMMIT)
    written, current = await store.swap_effect(done, "claimed")
    assert proxy.cut.is_set()
    assert written and current is not None and current.status == "done"


async def test_two_submits_with_one_request_id_at_the_same_instant_get_one_run(
    store: Store, pg_url: str
) -> None:
    """The other submitter's INSERT is in flight (not committed) when ours starts: ours
    waits on the unique index and, once the other commits, returns that run -- never a
    unique-violation error."""
    other = psycopg.connect(pg_url)
    try:
        now = time.time()
        other.execute(
            "INSERT INTO runs (id, tenant_id, kind, name, version, target, input, status, "
            "created_at, updated_at, available_at, request_id) VALUES ('r-other', 'default', "
            "'agent', 'agent', '1', %s, '{}', 'queued', %s, %s, %s, 'req-1')",
            (TARGET, now, now, now),
        )
        mine = asyncio.ensure_future(store.create_run(new_run(request_id="req-1")))
        deadline = time.monotonic() + 10
        while True:  # a positive signal: our INSERT waits for the other's lock
            waiting = other.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ).fetchone()
            if waiting and waiting[0] >= 1:
                break
            assert time.monotonic() < deadline and not mine.done(), mine
            await asyncio.sleep(0.01)
        other.commit()
        got = await mine
    finally:
        other.close()
    assert got.id == "r-other"
    assert await store.count_runs() == {"queued": 1}
