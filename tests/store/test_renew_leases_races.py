"""A heartbeat's renewal against concurrent writes of the same rows, on PostgreSQL
(READ COMMITTED): the renewal waits on a row another transaction holds, then re-reads
its newest version. It renews exactly the leases the owner still holds at their epoch on
a running run *after* that write, and writes nothing else of the row."""

from __future__ import annotations

import asyncio
import time

from agentledger.records import Run
from agentledger.store import Store, open_store
from agentledger.store._postgres import connect
from tests.store.test_postgres import lock_waiters, new_run, until

TARGET = "agent@1"


async def opened(url: str) -> Store:
    store = open_store(url)
    await store.open()
    return store


async def claimed(store: Store, owner: str, n: int, lease: float = 600) -> list[Run]:
    for _ in range(n):
        await store.create_run(new_run())
    got = await store.claim_runs(owner, [TARGET], n, lease)
    assert len(got) == n
    return sorted(got, key=lambda r: r.id)


async def test_a_renewal_waiting_on_an_unrelated_write_renews_the_lease_and_keeps_the_write(
    pg_url: str,
) -> None:
    """Another transaction writes the run's row (a cancel request, an event's seq) while
    the renewal waits for it: the lease is still this owner's at its epoch, so it is
    renewed -- never reported lost, which would stop a healthy execution -- and the
    other write's columns are kept (the renewal updates the newest version)."""
    store = await opened(pg_url)
    other = connect(pg_url)
    try:
        runs = await claimed(store, "w1", 3)
        busy = runs[1]
        other.execute(
            "UPDATE runs SET cancel_requested = 'stop please', event_seq = event_seq + 1 "
            "WHERE id = %s",
            (busy.id,),
        )
        renewal = asyncio.ensure_future(
            store.renew_leases("w1", {r.id: r.lease_epoch for r in runs}, 900)
        )
        assert await until(lambda: lock_waiters(pg_url) == 1)
        other.commit()
        assert await renewal == set()
        for run in runs:
            now = await store.get_run(run.id)
            assert now is not None and now.lease_owner == "w1"
            assert now.lease_epoch == run.lease_epoch
            assert now.lease_expires_at is not None and now.lease_expires_at > time.time() + 800
        kept = await store.get_run(busy.id)
        assert kept is not None and kept.cancel_requested == "stop please"
    finally:
        other.close()
        await store.close()


async def test_a_renewal_waiting_on_a_run_that_parks_meanwhile_leaves_it_parked(
    pg_url: str,
) -> None:
    """The run parks (its own fenced write: ``waiting``, lease dropped, same epoch) while
    the renewal waits for its row: it is reported lost (given back, not taken) and the
    parked row gets no lease expiry back."""
    store = await opened(pg_url)
    other = connect(pg_url)
    try:
        runs = await claimed(store, "w1", 3)
        parked = runs[0]
        other.execute(
            "UPDATE runs SET status = 'waiting', lease_owner = NULL, lease_expires_at = NULL, "
            "available_at = 1e12 WHERE id = %s AND lease_epoch = %s AND lease_owner = 'w1'",
            (parked.id, parked.lease_epoch),
        )
        renewal = asyncio.ensure_future(
            store.renew_leases("w1", {r.id: r.lease_epoch for r in runs}, 900)
        )
        assert await until(lambda: lock_waiters(pg_url) == 1)
        other.commit()
        assert await renewal == {parked.id}
        now = await store.get_run(parked.id)
        assert now is not None and now.status == "waiting"
        assert now.lease_owner is None and now.lease_expires_at is None
        assert now.lease_epoch == parked.lease_epoch
    finally:
        other.close()
        await store.close()


async def test_a_claim_never_takes_an_expired_lease_a_waiting_renewal_holds(
    pg_url: str,
) -> None:
    """The renewal has locked an expired lease (first in id order) and waits on the next
    row: a claim meanwhile skips the locked run, so the lease the renewal renews is not
    handed to another worker in the same instant; once the renewal commits the run is
    still the owner's, at its epoch, with a fresh lease."""
    store = await opened(pg_url)
    claimer = await opened(pg_url)
    other = connect(pg_url)
    try:
        runs = await claimed(store, "w1", 2, lease=0.05)
        await asyncio.sleep(0.1)  # both leases expired; nobody took them yet
        second = runs[1]
        other.execute("UPDATE runs SET event_seq = event_seq + 1 WHERE id = %s", (second.id,))
        renewal = asyncio.ensure_future(
            store.renew_leases("w1", {r.id: r.lease_epoch for r in runs}, 900)
        )
        assert await until(lambda: lock_waiters(pg_url) == 1)
        # The claim skips both: the first is locked by the renewal, the second by `other`.
        assert await claimer.claim_runs("w2", [TARGET], 10, 600) == []
        other.commit()
        assert await renewal == set()
        for run in runs:
            now = await store.get_run(run.id)
            assert now is not None and now.lease_owner == "w1"
            assert now.lease_epoch == run.lease_epoch
            assert now.lease_expires_at is not None and now.lease_expires_at > time.time() + 800
        assert await claimer.claim_runs("w2", [TARGET], 10, 600) == []
    finally:
        other.close()
        await claimer.close()
        await store.close()
