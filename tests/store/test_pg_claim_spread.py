"""PostgreSQL's claim when more than 10 x limit runs are due and many tenants have a
few each: the tenants' oldest runs among the oldest 10 x limit due runs (``spread``)
start the fair order. Every claim is checked against the model of
tests/store/test_claim_model.py, in worlds built to probe that first look: targets of
very different ages, ties in available_at (a batch enqueued in one transaction shares
it), expired leases older and younger than the first look's last run and than their
tenant's queued runs, tenants whose oldest run is held, parked runs due and not due,
a tenant's runs split across targets the worker serves and one it does not, and
exactly 10 x limit due runs.

With ties, the fair order is not one order: a run may come before another only when
it does in every order the ties allow (a rank is a range when its tenant has runs of
the same available_at)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from agentledger.store._postgres import PostgresDialect, connect, convert_placeholders
from tests.store.pg_claims import (
    TARGETS,
    Claimer,
    ClaimRace,
    claim_params,
    ctes,
    explain_claim,
    holding,
    insert_rows,
    rows_read,
    take,
)
from tests.store.test_claim_model import ALSO, OTHER, OURS, Row, claimable

pytestmark = pytest.mark.postgres


def _rank_ranges(runs: list[Row]) -> dict[str, tuple[int, int]]:
    """Each run's rank in its tenant, as a range when ties make it one."""
    by_tenant: dict[str, list[float]] = {}
    for r in runs:
        by_tenant.setdefault(r.tenant, []).append(r.available_at)
    out = {}
    for r in runs:
        ats = by_tenant[r.tenant]
        out[r.id] = (
            1 + sum(a < r.available_at for a in ats),
            sum(a <= r.available_at for a in ats),
        )
    return out


def check_claim(
    model: dict[str, Row], now: float, held: set[str], limit: int, got: list[str]
) -> None:
    """``got`` is a claim the model allows: claimable, unheld, no run twice, exactly
    ``limit`` unless fewer are left, and no unheld run left behind that comes before
    a claimed one in every fair order."""
    runs = claimable(model, TARGETS, now)
    ids = {r.id for r in runs}
    assert len(got) == len(set(got)), got
    assert set(got) <= ids - held, set(got) - (ids - held)
    free = ids - held
    assert len(got) == min(limit, len(free)), (len(got), limit, len(free))
    ranks = _rank_ranges(runs)
    at = {r.id: r.available_at for r in runs}
    left = free - set(got)
    for g in got:
        lo = (ranks[g][0], at[g])
        for x in left:
            hi = (ranks[x][1], at[x])
            assert not hi < lo, (
                f"{x} (rank {ranks[x]}, at {at[x]}) left behind for {g} (rank {ranks[g]}, "
                f"at {at[g]})"
            )


def many_tenants(seed: int, limit: int, now: float, *, tenants: int, ties: bool,
                 due: int | None = None) -> list[Row]:  # fmt: skip
    """``tenants`` tenants with 0-4 due runs each (or ``due`` in all), on our two
    targets with ALSO's runs much older, some of each tenant's on a target not
    served; parked runs; expired leases at every age; live leases."""
    rng = random.Random(seed)
    rows: list[Row] = []
    names = [f"T{i:04d}" for i in range(tenants)]
    if ties:
        at_of = lambda: now - 10_000 + rng.randrange(40) * 100.0  # noqa: E731
    else:
        seen: set[int] = set()

        def at_of() -> float:  # distinct, drawn as needed (a few hundred of a million)
            while (x := rng.randrange(1, 1_000_000)) in seen:
                pass
            seen.add(x)
            return now - 2_000_000 + x

    n = 0
    counts = [rng.choice([0, 1, 1, 2, 3, 4]) for _ in names]
    if due is not None:  # exactly ``due`` due runs
        counts = [0] * len(names)
        for _ in range(due):
            counts[rng.randrange(len(names))] += 1
    for tenant, k in zip(names, counts, strict=True):
        for _ in range(k):
            target = rng.choice([OURS, OURS, ALSO])
            at = at_of() - (500_000 if target == ALSO and not ties else 0)
            status = rng.choice(["queued", "queued", "waiting"])
            rows.append(Row(f"d{n:05d}", tenant, target, status, at))
            n += 1
    for i in range(rng.randrange(3, 12)):  # due, of a target not served
        rows.append(Row(f"o{i:05d}", rng.choice(names), OTHER, "queued", at_of() - 900_000))
    for i in range(rng.randrange(3, 12)):  # parked, not due
        rows.append(Row(f"p{i:05d}", rng.choice(names), rng.choice(TARGETS), "waiting",
                        now + 3600 + i))  # fmt: skip
    for i in range(rng.randrange(2, 3 * limit + 6)):  # expired leases, every age
        tenant = rng.choice([*names, f"X{i}"])
        at = rng.choice([at_of(), at_of() - 3_000_000, now - 1])
        rows.append(Row(f"x{i:05d}", tenant, rng.choice([OURS, ALSO, OTHER]), "running", at,
                        lease_expires_at=now - 5, lease_epoch=1))  # fmt: skip
    for i in range(3):  # live leases
        rows.append(Row(f"l{i:05d}", rng.choice(names), OURS, "running", at_of(),
                        lease_expires_at=now + 3600, lease_epoch=1))  # fmt: skip
    return rows


def _clear(url: str) -> None:
    conn = connect(url)
    conn.execute("DELETE FROM events")
    conn.execute("DELETE FROM runs")
    conn.commit()
    conn.close()


def _run_world(pg_url: str, conns: list[Any], rows: list[Row], limit: int, held_share: float,
               seed: int) -> None:  # fmt: skip
    now = time.time()
    insert_rows(pg_url, rows)
    model = {r.id: r for r in rows}
    rng = random.Random(seed)
    runs = claimable(model, TARGETS, now)
    # Hold some, each tenant's oldest preferred.
    oldest: dict[str, Row] = {}
    for r in sorted(runs, key=lambda r: r.available_at):
        oldest.setdefault(r.tenant, r)
    held = {r.id for r in runs if rng.random() < held_share}
    held |= {r.id for r in oldest.values() if rng.random() < held_share}
    holder = holding(pg_url, conns, sorted(held))
    claimer = Claimer(pg_url, "w")
    conns.append(claimer.conn)
    for _ in range(1000):
        got = claimer.claim(limit)
        check_claim(model, now, held, limit, got)
        take(model, got, now)
        if not got:
            break
    assert {r.id for r in claimable(model, TARGETS, now)} == held
    holder.rollback()
    while got := claimer.claim(limit):
        check_claim(model, now, set(), limit, got)
        take(model, got, now)
    assert claimable(model, TARGETS, now) == []


WORLDS = [
    # (limit, tenants, ties, held share)
    (1, 40, False, 0.0),
    (1, 40, True, 0.0),
    (2, 60, False, 0.2),
    (3, 80, True, 0.2),
    (5, 120, False, 0.1),
    (5, 120, True, 0.3),
    (8, 200, False, 0.0),
    (20, 300, True, 0.1),
]


@pytest.mark.parametrize(("limit", "tenants", "ties", "held_share"), WORLDS)
def test_many_tenants_follow_the_model(
    pg_url: str, conns: list[Any], limit: int, tenants: int, ties: bool, held_share: float
) -> None:
    for seed in range(2):
        rows = many_tenants(seed * 97 + limit, limit, time.time(), tenants=tenants, ties=ties)
        _run_world(pg_url, conns, rows, limit, held_share, seed)
        _clear(pg_url)


@pytest.mark.parametrize("limit", [1, 4, 7])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_around_ten_times_the_limit_due(
    pg_url: str, conns: list[Any], limit: int, delta: int
) -> None:
    for seed in range(3):
        rows = many_tenants(seed, limit, time.time(), tenants=3 * limit + 2, ties=seed == 1,
                            due=10 * limit + delta)  # fmt: skip
        _run_world(pg_url, conns, rows, limit, 0.15 * seed, seed)
        _clear(pg_url)


def test_a_target_named_twice_counts_its_runs_once(pg_url: str, conns: list[Any]) -> None:
    """A worker that names a target twice: each due run is still one run. Counted
    twice, a few due runs would look like many, and a run ranked twice would fill
    two of the claim's places, leaving it short with claimable runs left."""
    now = time.time()
    rows = [Row(f"{t}-{i}", t, OURS, "queued", now - 100 + i + (0.5 if t == "B" else 0))
            for t in ("A", "B") for i in range(3)]  # fmt: skip
    insert_rows(pg_url, rows)
    conn = connect(pg_url)
    conns.append(conn)
    sql = convert_placeholders(PostgresDialect(pg_url).claim_sql(2))
    got = sorted(r["id"] for r in conn.execute(sql, claim_params("w", 4, [OURS, OURS])))
    assert got == ["A-0", "A-1", "B-0", "B-1"]


def test_the_first_look_fills_the_claim_without_the_tenant_walk_and_the_rest_follows(
    pg_url: str, conns: list[Any]
) -> None:
    """3,000 tenants with one due run each, ALSO's far older than ours, and expired
    leases: the claim takes the oldest tenants' runs from the first look and never
    walks the tenants. With most of those held, the first look comes short and the
    tenant walk fills the claim, with the right runs."""
    now = time.time()
    n, limit = 3000, 5
    rows = [Row(f"r{i:05d}", f"t{i:05d}", ALSO if i % 2 else OURS, "queued",
                now - 10_000 + i - (5000 if i % 2 else 0)) for i in range(n)]  # fmt: skip
    rows += [Row(f"x{i}", f"t{i:05d}", OURS, "running", now - 20_000 + i * 3000,
                 lease_expires_at=now - 1, lease_epoch=1) for i in range(4)]  # fmt: skip
    insert_rows(pg_url, rows)
    conn = connect(pg_url)
    conns.append(conn)
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE runs")
    conn.autocommit = False
    plan = explain_claim(pg_url, conn, limit, TARGETS)
    found = ctes(plan)
    assert plan["Actual Rows"] == limit
    assert found.get("tenants", 0) == 0 and found.get("near", 0) == 0, found
    assert rows_read(plan) < 500, rows_read(plan)  # the walk alone: 3,000 seeks
    # Hold all but one of the first look's tenants' oldest runs (and what leases
    # rank 1): the claim takes that one, then walks the tenants for the rest.
    model = {r.id: r for r in rows}
    runs = claimable(model, TARGETS, now)
    order = sorted(runs, key=lambda r: r.available_at)[: 10 * limit]
    held = {r.id for r in order} - {order[7].id}
    holding(pg_url, conns, sorted(held))
    plan = explain_claim(pg_url, conn, limit, TARGETS)
    assert plan["Actual Rows"] == limit
    assert ctes(plan).get("near", 0) == 1
    claimer = Claimer(pg_url, "w")
    conns.append(claimer.conn)
    got = claimer.claim(limit, commit=False)
    check_claim(model, now, held, limit, got)
    # Only the claim's runs are locked by it: nothing the tenant walk read past them.
    other = connect(pg_url)
    conns.append(other)
    free = other.execute(
        "SELECT COUNT(*) AS n FROM (SELECT id FROM runs WHERE status IN "
        "('queued', 'waiting', 'running') FOR UPDATE SKIP LOCKED) s"
    ).fetchone()
    assert free is not None and free["n"] == len(rows) - len(held) - limit


@pytest.mark.parametrize(("limit", "workers"), [(1, 4), (3, 8), (10, 6)])
def test_concurrent_claimers_from_the_first_look_and_past_it(
    pg_url: str, conns: list[Any], limit: int, workers: int
) -> None:
    """Claimers on their own connections claim at once and keep their transaction
    open a moment: one's first look finds the others' rows held and comes short,
    another's fills. A tenant with the oldest 12 x limit runs (a first look of one
    tenant), many small tenants, expired leases, a holder keeping some runs. No run
    is claimed twice or taken from the holder, a short claim leaves nothing claimable
    that no one holds, and in the end every claimable run was claimed once."""
    now = time.time()
    rows = many_tenants(limit * 13 + workers, limit, now, tenants=40 * limit, ties=limit == 3)
    rows += [Row(f"b{i:05d}", "big", OURS, "queued", now - 4_000_000 + i)
             for i in range(12 * limit)]  # fmt: skip
    insert_rows(pg_url, rows)
    model = {r.id: r for r in rows}
    start = {r.id for r in claimable(model, TARGETS, now)}
    rng = random.Random(workers)
    held = sorted(i for i in start if rng.random() < 0.1)
    holder = holding(pg_url, conns, held)
    claimers = [Claimer(pg_url, f"w{n}") for n in range(workers)]
    conns.extend(c.conn for c in claimers)
    race = ClaimRace()
    taken = race.taken

    def round_() -> None:
        threads = [threading.Thread(target=race.work, args=(c, limit, n, 0.004))
                   for n, c in enumerate(claimers)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not race.errors, race.errors[:5]

    round_()
    assert set(taken) == start - set(held)
    holder.rollback()
    round_()
    assert set(taken) == start
