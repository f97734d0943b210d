"""PostgreSQL's claim past its first window: rows held at the depths where the claim
switches from each tenant's first 2 x limit due runs to the full tenants' first
16 x limit, and from those to the whole backlog. Every claim is checked against the
model of tests/store/test_claim_model.py: it takes the unheld claimable runs in fair
order (ranked among all claimable runs, held ones included), exactly ``limit`` of them
unless fewer are left; the held runs stay queued and are claimable once let go."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from agentledger.store._postgres import connect
from tests.store.pg_claims import (
    TARGETS,
    Claimer,
    ClaimRace,
    claimable_sql,
    claims_behind,
    holding,
    insert_rows,
    take,
)
from tests.store.test_claim_model import OTHER, OURS, Row, claimable, fair_order

pytestmark = pytest.mark.postgres


def _world(seed: int, limit: int, now: float) -> list[Row]:
    """Big tenants well past 16 x limit due runs, one between 2 x and 16 x limit,
    small tenants, and what must never be claimed (parked, other targets, live
    leases), plus expired leases older than every queued run of their tenant."""
    rng = random.Random(seed)
    rows: list[Row] = []
    sizes = {"big": 40 * limit + 3, "big2": 20 * limit, "mid": 5 * limit, "s1": 1, "s2": 2,
             "s3": limit + 1, "": 3}  # fmt: skip
    ats = iter(rng.sample(range(1, 1_000_000), sum(sizes.values())))
    for tenant, n in sizes.items():
        for i in range(n):
            status = rng.choice(["queued", "queued", "waiting"])
            rows.append(Row(f"{tenant or 'e'}-{i:05d}", tenant, rng.choice(TARGETS), status,
                            now - 2_000_000 + next(ats)))  # fmt: skip
    for i, tenant in enumerate(("big", "s1", "x")):
        rows.append(Row(f"x-{tenant}", tenant, OURS, "running", now - 3_000_000 + i,
                        lease_expires_at=now - 100, lease_epoch=1))  # fmt: skip
    for i in range(20 * limit):
        rows.append(Row(f"p-{i:05d}", rng.choice(["big", "s1"]), OURS, "queued",
                        now + 3600 + i))  # fmt: skip
        rows.append(Row(f"o-{i:05d}", rng.choice(["big", "s2"]), OTHER, "queued",
                        now - 3_000_000 + i))  # fmt: skip
    for i in range(3):
        rows.append(Row(f"l-{i:05d}", "big", OURS, "running", now - 3_000_000,
                        lease_expires_at=now + 3600, lease_epoch=1))  # fmt: skip
    return rows


def _by_depth(model: dict[str, Row], now: float, tenant: str, depths: range) -> list[str]:
    """The claimable runs of ``tenant`` at these ranks (0-based)."""
    mine = sorted((r for r in claimable(model, TARGETS, now) if r.tenant == tenant),
                  key=lambda r: r.available_at)  # fmt: skip
    return [r.id for r in mine[depths.start : depths.stop]]


def _helds(model: dict[str, Row], now: float, limit: int) -> dict[str, list[str]]:
    """Held rows around each switch of the claim."""
    d = lambda t, a, b: _by_depth(model, now, t, range(a, b))  # noqa: E731
    small = [r.id for r in claimable(model, TARGETS, now) if r.tenant in ("s1", "s2", "s3", "")]
    return {
        "big-3L": d("big", 0, 3 * limit),
        "big-2L-exact": d("big", 0, 2 * limit),
        "big-16L-minus-1": d("big", 0, 16 * limit - 1),
        "big-16L": d("big", 0, 16 * limit),
        "big-16L-plus-2": d("big", 0, 16 * limit + 2),
        "big-all-but-tail": d("big", 0, 40 * limit),
        "bigs-16L-and-small": d("big", 0, 16 * limit)
        + d("big2", 0, 16 * limit)
        + d("mid", 0, 5 * limit)
        + small,
        "everything-up-to-16L": d("big", 0, 17 * limit)
        + d("big2", 0, 20 * limit)
        + d("mid", 0, 5 * limit)
        + small
        + ["x-big", "x-s1", "x-x"],
        "gaps": d("big", 0, 2 * limit)
        + d("big", 2 * limit + 1, 16 * limit + 5)
        + d("big2", 0, 3 * limit),
    }


CASES = ["big-3L", "big-2L-exact", "big-16L-minus-1", "big-16L", "big-16L-plus-2",
         "big-all-but-tail", "bigs-16L-and-small", "everything-up-to-16L", "gaps"]  # fmt: skip


@pytest.mark.parametrize("limit", [1, 8])
@pytest.mark.parametrize("case", CASES)
def test_claims_past_held_windows_follow_the_model(
    pg_url: str, conns: list[Any], limit: int, case: str
) -> None:
    now = time.time()
    rows = _world(limit * 31 + CASES.index(case), limit, now)
    insert_rows(pg_url, rows)
    model = {r.id: r for r in rows}
    held = sorted(set(_helds(model, now, limit)[case]))
    holder = holding(pg_url, conns, held)
    claimer = Claimer(pg_url, "w")
    conns.append(claimer.conn)
    for n in range(2000):
        order = fair_order(claimable(model, TARGETS, now))
        want = [r.id for r in order if r.id not in held][:limit]
        got = claimer.claim(limit)
        assert sorted(got) == sorted(want), (n, case)
        take(model, got, now)
        if not got:
            break
    assert {r.id for r in claimable(model, TARGETS, now)} == set(held)
    # Let go: the held runs are still queued (or expired) and are claimed now.
    holder.rollback()
    rest: set[str] = set()
    while got := claimer.claim(limit):
        assert not rest & set(got)
        rest |= set(got)
    assert rest == set(held)


def test_a_held_expired_lease_keeps_its_rank_past_the_first_window(
    pg_url: str, conns: list[Any]
) -> None:
    """Tenant A's oldest claimable run is an expired lease, held (a claimer taking it
    over) with A's next 15 runs; B's first 16 runs are held. Rank 17 is the next of
    both, oldest first: B's, then A's, then B's... -- the lease counts in A's rank
    when the claim reads past the first window, as it does in the first."""
    now = time.time()
    rows = [Row("a-lease", "A", OURS, "running", now - 9000, lease_expires_at=now - 10,
                lease_epoch=1)]  # fmt: skip
    # A's runs and B's alternate in age, B's first: B-16 is older than A-15.
    rows += [Row(f"A-{i:02d}", "A", OURS, "queued", now - 5000 + 10 * i + 15) for i in range(30)]
    rows += [Row(f"B-{i:02d}", "B", OURS, "queued", now - 5000 + 10 * i) for i in range(30)]
    held = ["a-lease"] + [f"A-{i:02d}" for i in range(15)] + [f"B-{i:02d}" for i in range(16)]
    got = claims_behind(pg_url, conns, rows, held, 4)
    # Ranks 17: B-16 (older) then A-15; then ranks 17 again: B-17, A-16.
    assert got == [["B-16"], ["A-15"], ["B-17"], ["A-16"]]


def test_an_expired_lease_past_a_full_tenants_first_window_waits_for_its_rank(
    pg_url: str, conns: list[Any]
) -> None:
    """A's expired lease is younger than A's first three queued runs: its rank is 4.
    With A's and B's first two runs held, the first window shows A's first two and the
    lease (all expired leases are read with it), so the lease looks like A's rank 3;
    it must not be taken before the rank-3 runs past both windows (B-02, A-02)."""
    now = time.time()
    rows = [Row(f"A-{i:02d}", "A", OURS, "queued", now - 5000 + 10 * i + 5) for i in range(6)]
    rows += [Row(f"B-{i:02d}", "B", OURS, "queued", now - 5000 + 10 * i) for i in range(6)]
    rows.append(Row("a-lease", "A", OURS, "running", now - 5000 + 27,
                    lease_expires_at=now - 10, lease_epoch=1))  # fmt: skip
    got = claims_behind(pg_url, conns, rows, ["A-00", "A-01", "B-00", "B-01"], 4)
    # Rank 3: B-02 (older), A-02; rank 4: the lease (older than B-03), B-03.
    assert got == [["B-02"], ["A-02"], ["a-lease"], ["B-03"]]


def test_an_expired_lease_past_the_oldest_due_runs_is_ranked_after_its_tenants_older_runs(
    pg_url: str, conns: list[Any]
) -> None:
    """The ten oldest due runs are A's (the claim's first look, 10 x limit deep); B has a
    due run and, younger, an expired lease, both past them. B's due run is its rank 1:
    the lease must not be taken as B's first just because B's due run lies past that
    first look."""
    now = time.time()
    rows = [Row(f"A-{i:02d}", "A", OURS, "queued", now - 1000 + i) for i in range(10)]
    rows += [
        Row("B-q", "B", OURS, "queued", now - 900),
        Row("C-q", "C", OURS, "queued", now - 850),
        Row("b-lease", "B", OURS, "running", now - 800, lease_expires_at=now - 10,
            lease_epoch=1),
    ]  # fmt: skip
    got = claims_behind(pg_url, conns, rows, ["A-00"], 4)
    # Rank 1 (A-00 held): B-q, C-q; then B's lease is B's rank 1, older than A's rank 2.
    assert got == [["B-q"], ["C-q"], ["b-lease"], ["A-01"]]


@pytest.mark.parametrize(("limit", "workers"), [(1, 3), (5, 12), (2, 30)])
def test_concurrent_claimers_past_every_window(
    pg_url: str, conns: list[Any], limit: int, workers: int
) -> None:
    """``workers`` claimers, each on its own connection, claim at once and keep their
    claim's transaction open a moment, so the others reach past 2 x and 16 x limit.
    One holder keeps big's first 17 x limit runs (they commit as running later),
    another some of every tenant's (they roll back later), a third takes runs
    meanwhile and commits them as running. No run is claimed twice or taken from a
    holder; a short claim leaves nothing claimable that no one holds; in the end every
    claimable run was claimed by exactly one of them."""
    now = time.time()
    rows = _world(limit * 7 + workers, limit, now)
    insert_rows(pg_url, rows)
    model = {r.id: r for r in rows}
    start = claimable(model, TARGETS, now)
    rng = random.Random(workers)
    commits = _by_depth(model, now, "big", range(0, 17 * limit))
    rollbacks = [r.id for r in start if r.id not in commits and rng.random() < 0.2]
    h1, h2 = holding(pg_url, conns, commits), holding(pg_url, conns, rollbacks)
    h3 = connect(pg_url)
    conns.append(h3)
    claimers = [Claimer(pg_url, f"w{n}") for n in range(workers)]
    conns.extend(c.conn for c in claimers)
    race = ClaimRace()
    taken = race.taken

    def rival() -> None:
        # Another claimer: takes some runs FOR UPDATE SKIP LOCKED and commits them.
        for _ in range(5):
            ids = [r["id"] for r in h3.execute(
                claimable_sql() + " ORDER BY id DESC LIMIT 3 FOR UPDATE SKIP LOCKED",
                {"targets": TARGETS, "mine": []},
            ).fetchall()]  # fmt: skip
            h3.execute("UPDATE runs SET status = 'running', lease_owner = 'rival', "
                       "lease_expires_at = %s WHERE id = ANY(%s)", (now + 3600, ids))  # fmt: skip
            time.sleep(0.003)
            h3.commit()
            race.record("rival", ids)

    def round_() -> None:
        threads = [threading.Thread(target=race.work, args=(c, limit, n, 0.005))
                   for n, c in enumerate(claimers)]  # fmt: skip
        threads.append(threading.Thread(target=rival))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not race.errors, race.errors[:5]

    round_()
    assert not set(taken) & (set(commits) | set(rollbacks))
    # The first holder commits its runs as running; the second lets go of its own.
    h1.execute("UPDATE runs SET status = 'running', lease_owner = 'h1', lease_expires_at = %s "
               "WHERE id = ANY(%s)", (now + 3600, commits))  # fmt: skip
    h1.commit()
    h2.rollback()
    round_()
    assert set(taken) == {r.id for r in start} - set(commits)
    # What was taken is running under its claimer; nothing claimable is left, and
    # parked runs, other targets' and live leases were never touched.
    check = connect(pg_url)
    conns.append(check)
    left = check.execute(claimable_sql(), {"targets": TARGETS, "mine": []}).fetchall()
    assert left == []
    owners = {r["id"]: r["lease_owner"] for r in check.execute(
        "SELECT id, lease_owner FROM runs WHERE status = 'running'").fetchall()}  # fmt: skip
    for run_id, who in taken.items():
        assert owners[run_id] == who
    untouched = [r.id for r in rows if r.id.startswith(("p-", "o-", "l-"))]
    touched = check.execute(
        "SELECT id FROM runs WHERE id = ANY(%s) AND status = 'running' "
        "AND lease_owner IS DISTINCT FROM 'dead'",
        (untouched,),
    ).fetchall()
    assert touched == []
