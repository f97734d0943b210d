"""A heartbeat's renewal of many leases, on every backend: one statement that renews
every lease the owner still holds at the given epoch (fenced by owner, epoch and
``running``, the expiry on the database's clock) and reports exactly the others lost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agentledger.records import Run
from agentledger.store import Batch, NewRun, RunUpdate, Store
from agentledger.store._queries import runs as run_queries
from agentledger.store._tx import Tx

TARGET = "agent@1"


def new_run() -> NewRun:
    return NewRun(kind="agent", name="agent", version="1", input={})


async def claim(store: Store, owner: str, n: int, lease: float = 600) -> list[Run]:
    for _ in range(n):
        await store.create_run(new_run())
    got = await store.claim_runs(owner, [TARGET], n, lease)
    assert len(got) == n
    return got


async def expiries(store: Store, ids: list[str]) -> dict[str, float | None]:
    found = {}
    for run_id in ids:
        run = await store.get_run(run_id)
        assert run is not None
        found[run_id] = run.lease_expires_at
    return found


async def test_renewal_reports_lost_exactly_the_runs_whose_fence_moved(store: Store) -> None:
    # A lease taken over: w1's run expired, w2 claimed it (a newer epoch).
    (lapsed,) = await claim(store, "w1", 1, lease=0.05)
    await asyncio.sleep(0.1)
    assert [r.id for r in await store.claim_runs("w2", [TARGET], 10, 600)] == [lapsed.id]
    # Leases that expired but that nobody took are still the owner's: renewed, not lost.
    expired = await claim(store, "w1", 3, lease=0.05)
    await asyncio.sleep(0.1)
    kept = await claim(store, "w1", 20)
    stale = await claim(store, "w1", 2)  # renewed at an older epoch than the run's
    released = await claim(store, "w1", 2)
    finished = await claim(store, "w1", 2)
    others = await claim(store, "w2", 2)  # w2's runs, named by w1
    for run in released:
        assert await store.release_run(run.id, run.lease_epoch, "w1")
    for run in finished:
        await store.commit(Batch(run.id, run.lease_epoch, "w1", run=RunUpdate(status="completed")))

    leases = {r.id: r.lease_epoch for r in [*expired, *kept, *released, *finished, *others]}
    leases.update({r.id: r.lease_epoch - 1 for r in stale})
    leases[lapsed.id] = lapsed.lease_epoch
    leases["r-no-such-run"] = 1
    before = await expiries(store, [r for r in leases if r != "r-no-such-run"])
    started = time.time()

    lost = await store.renew_leases("w1", leases, 300)

    renewed = {r.id for r in [*expired, *kept]}
    assert lost == set(leases) - renewed
    after = await expiries(store, list(before))
    for run_id in renewed:
        # Written on the database's clock as now + the lease (the host's clock here).
        expiry = after[run_id]
        assert expiry is not None and started + 300 - 5 < expiry < time.time() + 300 + 5
    for run_id in set(before) - renewed:
        assert after[run_id] == before[run_id]  # nothing lost was touched
    # A renewal at the right epoch by another owner is refused too.
    assert await store.renew_leases("w2", {r.id: r.lease_epoch for r in kept[:3]}, 300) == {
        r.id for r in kept[:3]
    }
    assert await store.renew_leases("w1", {}, 300) == set()


async def test_renewal_of_runs_partly_lost_leaves_the_new_owners_lease_alone(
    store: Store,
) -> None:
    mine = await claim(store, "w1", 6, lease=0.05)
    await asyncio.sleep(0.1)
    theirs = await store.claim_runs("w2", [TARGET], 3, 30)
    assert len(theirs) == 3
    held = {r.id: r.lease_expires_at for r in theirs}
    lost = await store.renew_leases("w1", {r.id: r.lease_epoch for r in mine}, 600)
    assert lost == set(held)
    for run_id, expiry in held.items():
        run = await store.get_run(run_id)
        assert run is not None and run.lease_owner == "w2" and run.lease_expires_at == expiry


class CountingTx:
    """A Tx that counts the statements an operation issues."""

    def __init__(self, tx: Tx) -> None:
        self.tx = tx
        self.statements = 0
        self.dialect, self.conn, self.now = tx.dialect, tx.conn, tx.now

    def execute(self, *args: Any, **kw: Any) -> int:
        self.statements += 1
        return self.tx.execute(*args, **kw)

    def fetchall(self, *args: Any, **kw: Any) -> list[dict[str, Any]]:
        self.statements += 1
        return self.tx.fetchall(*args, **kw)


async def test_a_heartbeat_renews_every_lease_in_one_statement(store: Store) -> None:
    """One round trip per heartbeat, however many runs the worker holds: one statement
    also takes its row locks in the order it states (see test_postgres)."""
    runs = await claim(store, "w1", 50)
    leases = {r.id: r.lease_epoch for r in runs}
    leases[runs[0].id] -= 1  # a lost one among them
    counted: list[int] = []

    def renew(tx: Tx) -> set[str]:
        counting = CountingTx(tx)
        lost = run_queries.renew_leases(counting, "w1", leases, 60)  # type: ignore[arg-type]
        counted.append(counting.statements)
        return lost

    assert await store.transact(renew) == {runs[0].id}
    assert counted[-1] == 1


async def test_an_epoch_past_64_bits_is_lost_not_an_error(store: Store) -> None:
    (run,) = await claim(store, "w1", 1)
    (other,) = await claim(store, "w1", 1)
    leases = {run.id: 2**64, other.id: other.lease_epoch}
    assert await store.renew_leases("w1", leases, 30) == {run.id}
    assert await store.renew_leases("w1", {run.id: -(2**70)}, 30) == {run.id}


async def test_hostile_ids_and_epochs_at_the_64_bit_edges_are_lost_not_errors(
    store: Store,
) -> None:
    """Ids no run has (quotes, placeholders, NUL, lone surrogates, a megabyte) and epochs
    at the edges of 64 bits ride in the statement's parameters: each is lost, the
    statement does not fail, and the real lease among them is renewed."""
    (run,) = await claim(store, "w1", 1)
    hostile = [
        "", "'", "''); DROP TABLE runs; --", '"', "\\", "a\x00b", "\x00", "\ud800", "é",
        "\U0001f600", "\u2028", "%s", "%(owner)s", ":owner", "$1", "[1, 2]", "1", "null",
        "x" * 1_000_000,
    ]  # fmt: skip
    leases = dict.fromkeys(hostile, run.lease_epoch)
    leases[run.id] = run.lease_epoch
    assert await store.renew_leases("w1", leases, 30) == set(hostile)
    for epoch in (0, -1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1):
        assert await store.renew_leases("w1", {run.id: epoch}, 30) == {run.id}, epoch
    assert await store.renew_leases("w1'", {run.id: run.lease_epoch}, 30) == {run.id}
    assert await store.renew_leases("w1", {run.id: run.lease_epoch}, 30) == set()


async def test_a_renewal_of_tens_of_thousands_of_leases_is_one_statement_that_works(
    store: Store,
) -> None:
    """Past PostgreSQL's 65,535 bind parameters and SQLite's 32,766 variables: the
    leases ride in two arrays (a JSON text on SQLite), whatever their number; and the
    statement's text does not change with it, so a prepared one serves every size."""
    runs = await claim(store, "w1", 20)
    leases = {r.id: r.lease_epoch for r in runs}
    missing = {f"r-gone-{i}": i for i in range(70_000)}
    for size in (70_000, 3, 70_000, 1, 500, 70_000, 2, 7):  # past psycopg's prepare threshold
        asked = dict(leases)
        asked.update(dict(list(missing.items())[:size]))
        assert await store.renew_leases("w1", asked, 30) == set(asked) - set(leases)


async def test_a_heartbeats_cancel_requests_of_70000_runs_are_one_statement_that_works(
    store: Store,
) -> None:
    """The heartbeat's other read, for every lease it renewed: a worker holding more
    runs than PostgreSQL takes bind parameters (65,535) still reads their cancel
    requests, in one statement whose text does not change with their number."""
    runs = await claim(store, "w1", 3)
    await store.cancel_run(runs[1].id, "user asked", "bob")
    ids = [r.id for r in runs] + [f"r-gone-{i}" for i in range(70_000)] + ["a\x00", "'"]
    expected = {runs[1].id: "user asked"}
    counted: list[int] = []

    def read(tx: Tx) -> dict[str, str]:
        counting = CountingTx(tx)
        found = run_queries.cancel_requests(counting, ids)  # type: ignore[arg-type]
        counted.append(counting.statements)
        return found

    for size in (len(ids), 3, len(ids), 2, 500, len(ids), 1, 7):  # past prepare thresholds
        found = await store.read(lambda tx, n=size: run_queries.cancel_requests(tx, ids[:n]))
        assert found == (expected if size > 1 else {}), size
    assert await store.transact(read) == expected and counted == [1]
