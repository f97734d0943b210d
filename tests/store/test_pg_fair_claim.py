"""PostgreSQL's fair claim reads each tenant's first due runs by index; with a backlog
far beyond that window it must still be fair, skip the rows a concurrent claimer holds
(reaching a tenant's later rows when its first ones are all held), take over expired
leases and never take a run of a target the worker does not serve."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from agentledger.store import Store, open_store
from agentledger.store._tx import Tx
from tests.store.conftest import hold

pytestmark = pytest.mark.postgres

OURS = "w@1"
OTHER = "other@1"


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    # A claim that waits for a row lock fails after 5 s instead of hanging (a claim
    # must never wait: it skips what another claimer holds).
    opened = open_store(pg_url + "?options=-c%20lock_timeout%3D5000")
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


def _insert(tx: Tx, rows: list[tuple[str, str, str, float]]) -> None:
    """Queued runs (id, tenant, target, available_at), written directly."""
    for run_id, tenant, target, at in rows:
        name, version = target.split("@")
        tx.execute(
            "INSERT INTO runs (id, tenant_id, kind, name, version, target, input, status, "
            "created_at, updated_at, available_at) VALUES (:id, :tenant, 'workflow', :name, "
            ":version, :target, '{}', 'queued', :at, :at, :at)",
            {
                "id": run_id,
                "tenant": tenant,
                "name": name,
                "version": version,
                "target": target,
                "at": at,
            },
        )


def backlog(
    tenant: str, n: int, first_at: float, target: str = OURS
) -> list[tuple[str, str, str, float]]:
    """``n`` due runs of ``tenant``, ids ``<tenant>-0000``... in available_at order."""
    return [(f"{tenant}-{i:04d}", tenant, target, first_at + i * 0.01) for i in range(n)]


async def test_fair_round_robin_with_a_backlog_beyond_the_window(store: Store) -> None:
    now = time.time()
    # A's 500 runs are all older than B's and C's: oldest-first would give A the claim.
    rows = backlog("A", 500, now - 3000) + backlog("B", 3, now - 100) + backlog("C", 3, now - 50)
    await store.transact(_insert, rows)
    claimed = await store.claim_runs("w1", [OURS], 10, 60.0)
    # Rank 1 of each tenant, then rank 2, then rank 3, then A alone.
    assert sorted(r.id for r in claimed) == sorted(
        [f"A-{i:04d}" for i in range(4)] + [f"{t}-{i:04d}" for t in "BC" for i in range(3)]
    )
    more = await store.claim_runs("w2", [OURS], 30, 60.0)
    assert sorted(r.id for r in more) == [f"A-{i:04d}" for i in range(4, 34)]


async def test_a_held_tenant_head_leaves_its_later_rows_and_other_tenants_claimable(
    store: Store, holder: psycopg.Connection[Any]
) -> None:
    now = time.time()
    a = backlog("A", 200, now - 3000)
    b = backlog("B", 2, now - 100)
    await store.transact(_insert, a + b)
    # Another claimer holds A's first 3 runs (inside the claim's window).
    hold(holder, [r[0] for r in a[:3]])
    claimed = await store.claim_runs("w1", [OURS], 6, 60.0)
    assert sorted(r.id for r in claimed) == sorted([r[0] for r in a[3:7]] + [r[0] for r in b])


async def test_a_claim_reaches_past_a_tenants_held_rows_beyond_the_window(
    store: Store, holder: psycopg.Connection[Any]
) -> None:
    now = time.time()
    a = backlog("A", 300, now - 3000)
    await store.transact(_insert, a)
    # Other claimers hold A's first 120 runs: far more than a claim of 5 looks at
    # first. The claim must still find A's later runs, never a held one.
    hold(holder, [r[0] for r in a[:120]])
    claimed = await store.claim_runs("w1", [OURS], 5, 60.0)
    assert sorted(r.id for r in claimed) == [r[0] for r in a[120:125]]
    # The held rows are untouched: still queued once the other claimer lets go.
    holder.rollback()
    states = await store.transact(
        lambda tx: tx.fetchall("SELECT status FROM runs WHERE id < 'A-0120'")
    )
    assert {s["status"] for s in states} == {"queued"}


async def test_held_rows_and_a_target_not_served(
    store: Store, holder: psycopg.Connection[Any]
) -> None:
    now = time.time()
    # A's oldest 150 runs are for another target; then 40 of ours, then more others.
    rows = backlog("A", 150, now - 3000, OTHER)
    ours = [(f"A-o{i:03d}", "A", OURS, now - 1000 + i * 0.01) for i in range(80)]
    rows += ours + [(f"A-x{i:03d}", "A", OTHER, now - 500 + i * 0.01) for i in range(50)]
    await store.transact(_insert, rows)
    claimed = await store.claim_runs("w1", [OURS], 4, 60.0)
    assert sorted(r.id for r in claimed) == [r[0] for r in ours[:4]]
    # With our next 30 held by another claimer, the claim reaches past them -- and
    # still never takes a run of the other target.
    hold(holder, [r[0] for r in ours[4:34]])
    more = await store.claim_runs("w2", [OURS], 5, 60.0)
    assert sorted(r.id for r in more) == [r[0] for r in ours[34:39]]


async def test_few_due_runs_among_many_parked_tenants(
    store: Store, holder: psycopg.Connection[Any]
) -> None:
    now = time.time()
    # 300 tenants with a run parked for an hour (waiting, not due), and a few due runs:
    # the claim reads the due ones only, fairly, skipping the held one.
    parked = [(f"P{i:03d}-0000", f"P{i:03d}", OURS, now + 3600) for i in range(300)]
    due = backlog("A", 4, now - 100) + backlog("B", 2, now - 50)
    await store.transact(_insert, parked + due)
    await store.transact(
        lambda tx: tx.execute("UPDATE runs SET status = 'waiting' WHERE id LIKE 'P%'")
    )
    hold(holder, ["A-0000"])
    claimed = await store.claim_runs("w1", [OURS], 3, 60.0)
    assert sorted(r.id for r in claimed) == ["A-0001", "B-0000", "B-0001"]
    holder.rollback()
    more = await store.claim_runs("w2", [OURS], 50, 60.0)
    assert sorted(r.id for r in more) == ["A-0000", "A-0002", "A-0003"]


async def test_expired_leases_are_taken_over_with_a_big_backlog(store: Store) -> None:
    now = time.time()
    # X has no queued run left, only one whose lease expired; A has a big backlog.
    rows = [*backlog("A", 300, now - 3000), ("X-0000", "X", OURS, now - 4000)]
    await store.transact(_insert, rows)
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE runs SET status = 'running', lease_owner = 'dead', lease_epoch = 3, "
            "lease_expires_at = :past WHERE id IN ('X-0000', 'A-0000')",
            {"past": now - 10},
        )
    )
    claimed = await store.claim_runs("w1", [OURS], 3, 60.0)
    # Rank 1 of X is its expired run; A's rank 1 is its expired run, then its queue.
    assert sorted(r.id for r in claimed) == ["A-0000", "A-0001", "X-0000"]
    taken = {r.id: r for r in claimed}
    assert taken["X-0000"].lease_epoch == 4 and taken["X-0000"].lease_owner == "w1"
    assert taken["X-0000"].resumes == 1
