"""The fair claim against a model, on each backend, at the boundaries of its shortcuts.

The claim reads the first 10 x limit due runs first and, when there are fewer, ranks
only those; otherwise it ranks each tenant's first due runs (a window of a few x
limit) and, on PostgreSQL, falls back to the whole backlog when concurrent claimers
hold a window. Each test here claims until the claim comes back empty and checks
every claim against a model computed from the rows: which runs are claimable (the
worker's targets; queued or waiting and due, or running with an expired lease), the
fair order (rank 1 of every tenant, then rank 2, ...), and that nothing claimable is
left once a claim finds nothing (a ``worker --burst`` exits then).

On PostgreSQL, concurrent claimers (each its own store and connections) and a
connection holding rows FOR UPDATE in an open transaction: no run is claimed twice,
no claim takes a held run, and a claim is short only when every other claimable run
is held.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from agentledger.store import Store, open_store
from agentledger.store._tx import Tx
from tests.store.conftest import hold

OURS = "w@1"
ALSO = "w@2"  # a second version the same worker serves
OTHER = "other@1"
# Tenant ids a claim must order and hop over like any other: the empty string (the
# smallest text), non-ASCII, and long ids.
ODD_TENANTS = ["", "é", "租户", "Z" * 300, "a b", "A"]


@dataclass
class Row:
    """One run as written: the model reads the same values."""

    id: str
    tenant: str
    target: str
    status: str
    available_at: float
    lease_expires_at: float | None = None
    lease_epoch: int = 0


def _insert(tx: Tx, rows: list[Row]) -> None:
    for row in rows:
        name, version = row.target.split("@")
        tx.execute(
            "INSERT INTO runs (id, tenant_id, kind, name, version, target, input, status, "
            "created_at, updated_at, available_at, lease_expires_at, lease_epoch, "
            "lease_owner) VALUES (:id, :tenant, 'workflow', :name, :version, :target, '{}', "
            ":status, :at, :at, :at, :lease, :epoch, :owner)",
            {
                "id": row.id,
                "tenant": row.tenant,
                "name": name,
                "version": version,
                "target": row.target,
                "status": row.status,
                "at": row.available_at,
                "lease": row.lease_expires_at,
                "epoch": row.lease_epoch,
                "owner": "dead" if row.status == "running" else None,
            },
        )


def claimable(rows: dict[str, Row], targets: list[str], now: float) -> list[Row]:
    """The model: runs a claim of ``targets`` may take at ``now``."""
    return [
        r
        for r in rows.values()
        if r.target in targets
        and (
            (r.status in ("queued", "waiting") and r.available_at <= now)
            or (
                r.status == "running"
                and r.lease_expires_at is not None
                and r.lease_expires_at < now
            )
        )
    ]


def fair_order(runs: list[Row]) -> list[Row]:
    """Rank each tenant's runs by available_at; rank 1 of every tenant, then rank 2..."""
    by_tenant: dict[str, list[Row]] = {}
    for r in sorted(runs, key=lambda r: r.available_at):
        by_tenant.setdefault(r.tenant, []).append(r)
    ranked = [(i, r.available_at, r.id, r) for rs in by_tenant.values() for i, r in enumerate(rs)]
    return [r for *_, r in sorted(ranked, key=lambda x: (x[0], x[1], x[2]))]


def shape(seed: int, limit: int, due: int, *, tenants: list[str], now: float) -> list[Row]:
    """``due`` due runs of our two targets spread over ``tenants`` (distinct
    available_at), plus parked runs (waiting, due in an hour), other targets' due runs,
    finished runs, live leases, and expired leases -- one of them of a tenant with
    no queued run at all."""
    rng = random.Random(seed)
    rows: list[Row] = []
    ats = rng.sample(range(1, 100_000), due)
    for i, at in enumerate(ats):
        status = rng.choice(["queued", "queued", "waiting"])
        rows.append(Row(f"d{i:05d}", rng.choice(tenants), rng.choice([OURS, ALSO]), status,
                        now - 200_000 + at))  # fmt: skip
    for i in range(3 * limit + 7):  # parked, not due: never claimable now
        rows.append(Row(f"p{i:05d}", rng.choice([*tenants, "parked-only"]),
                        rng.choice([OURS, ALSO]), "waiting", now + 3600 + i))  # fmt: skip
    for i in range(4 * limit + 3):  # due, but of a target this worker does not serve
        rows.append(Row(f"o{i:05d}", rng.choice(tenants), OTHER, "queued",
                        now - 300_000 + i))  # fmt: skip
    for i in range(5):
        rows.append(Row(f"f{i:05d}", rng.choice(tenants), OURS, "succeeded", now - 10))
        rows.append(Row(f"l{i:05d}", rng.choice(tenants), OURS, "running", now - 10,
                        lease_expires_at=now + 3600, lease_epoch=1))  # fmt: skip
    rows.append(Row("x-only", "expired-only", OURS, "running", now - 400_000,
                    lease_expires_at=now - 100, lease_epoch=3))  # fmt: skip
    for i in range(2):
        rows.append(Row(f"x{i:05d}", rng.choice(tenants), ALSO, "running", now - 150_000 + i,
                        lease_expires_at=now - 50, lease_epoch=2))  # fmt: skip
    return rows


def _boundaries() -> Iterator[tuple[int, int]]:
    """(limit, due queued runs) around the 10 x limit switch."""
    for limit in (1, 3):
        for due in (10 * limit - 1, 10 * limit, 10 * limit + 1, 25 * limit):
            yield limit, due


@pytest.mark.parametrize(("limit", "due"), list(_boundaries()))
async def test_claims_follow_the_model_until_empty(store: Store, limit: int, due: int) -> None:
    now = time.time()
    rows = shape(limit * 100 + due, limit, due, tenants=ODD_TENANTS, now=now)
    await store.transact(_insert, rows)
    model = {r.id: r for r in rows}
    targets = [OURS, ALSO]
    epochs = {r.id: r.lease_epoch for r in rows}
    for n in range(1000):
        want = fair_order(claimable(model, targets, now))[:limit]
        got = await store.claim_runs(f"w{n}", targets, limit, 3600.0)
        assert sorted(r.id for r in got) == sorted(r.id for r in want), n
        for run in got:
            before = model[run.id]
            assert run.lease_epoch == epochs[run.id] + 1
            assert run.resumes == (1 if before.status == "running" else 0)
            model[run.id] = Row(run.id, before.tenant, before.target, "running",
                                before.available_at, lease_expires_at=now + 3600)  # fmt: skip
        if not got:
            break
    # The claim came back empty: nothing claimable is left.
    assert claimable(model, targets, time.time()) == []
    left = await store.transact(
        lambda tx: tx.fetchall(
            "SELECT COUNT(*) AS n FROM runs WHERE target IN (:a, :b) AND status IN "
            "('queued', 'waiting') AND available_at <= :now",
            {"a": OURS, "b": ALSO, "now": now},
        )
    )
    assert left[0]["n"] == 0


# PostgreSQL: concurrent claimers and held rows ----------------------------------------


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[list[Store]]:
    """Four stores on one database: four workers, each with its own connections. A claim
    that waits for a row lock fails after 5 s instead of hanging."""
    opened = [open_store(pg_url + "?options=-c%20lock_timeout%3D5000") for _ in range(4)]
    for s in opened:
        await s.open()
    try:
        yield opened
    finally:
        for s in opened:
            await s.close()


@pytest.mark.postgres
@pytest.mark.parametrize(("limit", "due"), [(1, 9), (1, 10), (2, 40), (5, 49), (5, 50), (5, 400)])
async def test_concurrent_claimers_with_held_rows(
    stores: list[Store], holder: psycopg.Connection[Any], limit: int, due: int
) -> None:
    now = time.time()
    tenants = ["big", "", "é", "small"]
    rows = shape(due * 7 + limit, limit, due, tenants=tenants, now=now)
    # One tenant with exactly 2 x limit due runs, all of them held: its window is
    # full and held, and the claim must look past it (or know there is nothing).
    rows += [Row(f"h{i:05d}", "held", OURS, "queued", now - 500_000 + i) for i in range(2 * limit)]
    # "big" has the oldest runs of all: the first 3 x limit of them held.
    rows += [Row(f"b{i:05d}", "big", OURS, "queued", now - 450_000 + i) for i in range(6 * limit)]
    await stores[0].transact(_insert, rows)
    model = {r.id: r for r in rows}
    targets = [OURS, ALSO]
    held = [f"h{i:05d}" for i in range(2 * limit)] + [f"b{i:05d}" for i in range(3 * limit)]
    hold(holder, held)
    expected = {r.id for r in claimable(model, targets, now)} - set(held)

    taken: dict[str, str] = {}

    async def worker(n: int, s: Store) -> None:
        while True:
            got = await s.claim_runs(f"w{n}", targets, limit, 3600.0)
            for run in got:
                assert run.id not in taken, f"{run.id} claimed by {taken[run.id]} and w{n}"
                taken[run.id] = f"w{n}"
            if not got:
                return

    await asyncio.gather(*(worker(n, s) for n, s in enumerate(stores)))
    assert set(taken) == expected
    # Let go of the held rows: they are still queued, and claimable now.
    holder.rollback()
    rest: set[str] = set()
    while got := await stores[0].claim_runs("late", targets, limit, 3600.0):
        rest |= {r.id for r in got}
    assert rest == set(held)


@pytest.mark.postgres
async def test_a_claim_short_of_limit_only_when_the_rest_is_held(
    stores: list[Store], holder: psycopg.Connection[Any]
) -> None:
    """Held rows in every position of the windows: each claim takes exactly
    min(limit, unheld claimable runs left)."""
    now = time.time()
    limit = 4
    rows = shape(11, limit, 10 * limit, tenants=["A", "B", "", "C"], now=now)
    rows += [Row(f"b{i:05d}", "big", OURS, "queued", now - 450_000 + i) for i in range(60)]
    await stores[0].transact(_insert, rows)
    model = {r.id: r for r in rows}
    targets = [OURS, ALSO]
    rng = random.Random(5)
    all_claimable = fair_order(claimable(model, targets, now))
    held = [r.id for r in all_claimable if rng.random() < 0.5]
    hold(holder, held)
    left = {r.id for r in all_claimable} - set(held)
    for n in range(100):
        got = await stores[n % 4].claim_runs(f"w{n}", targets, limit, 3600.0)
        ids = {r.id for r in got}
        assert ids <= left, ids - left
        assert len(ids) == min(limit, len(left)), (n, len(left))
        left -= ids
        if not got:
            break
    assert left == set()
