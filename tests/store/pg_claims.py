"""What the PostgreSQL claim tests share: the claim statement on plain connections
(claimers, holders of rows, EXPLAIN ANALYZE of it), seeding rows of the claim model
(tests/store/test_claim_model.py), and a race of concurrent claimers that records who
took what."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from agentledger.store._postgres import PostgresDialect, connect, convert_placeholders
from tests.store.conftest import hold
from tests.store.test_claim_model import ALSO, OURS, Row, _insert

TARGETS = [OURS, ALSO]


def claim_params(owner: str, limit: int, targets: list[str]) -> dict[str, Any]:
    """The claim statement's parameters (a lease of an hour)."""
    params: dict[str, Any] = {"owner": owner, "token": "t", "lease": 3600.0, "limit": limit}
    params.update({f"t{i}": t for i, t in enumerate(targets)})
    return params


class Claimer:
    """One worker's connection: claims in its own transaction, then commits."""

    def __init__(self, url: str, name: str) -> None:
        self.name = name
        self.conn = connect(url)
        self.sql = convert_placeholders(PostgresDialect(url).claim_sql(len(TARGETS)))

    def claim(self, limit: int, *, commit: bool = True) -> list[str]:
        params = claim_params(self.name, limit, TARGETS)
        got = [r["id"] for r in self.conn.execute(self.sql, params).fetchall()]
        if commit:
            self.conn.commit()
        return got


def insert_rows(url: str, rows: list[Row]) -> None:
    """Insert the model's ``rows``."""
    conn = connect(url)
    try:
        cur = conn.cursor()

        class PlainTx:  # the store's tx.execute(sql, params), on a plain connection
            @staticmethod
            def execute(sql: str, params: dict[str, Any]) -> None:
                cur.execute(convert_placeholders(sql), params)

        with conn.pipeline():  # one round trip for the lot, not one per row
            _insert(PlainTx, rows)  # type: ignore[arg-type]
        conn.commit()
    finally:
        conn.close()


def holding(url: str, conns: list[Any], ids: list[str]) -> Any:
    """A new connection holding ``ids`` (:func:`tests.store.conftest.hold`), as a
    claimer in the middle of its transaction does; closed with ``conns``."""
    holder = connect(url)
    conns.append(holder)
    hold(holder, ids)
    return holder


def claims_behind(
    url: str, conns: list[Any], rows: list[Row], held: list[str], n: int, limit: int = 1
) -> list[list[str]]:
    """Seed ``rows``, hold ``held``, and return ``n`` claims of ``limit`` one after the
    other (each committed)."""
    insert_rows(url, rows)
    holding(url, conns, held)
    claimer = Claimer(url, "w")
    conns.append(claimer.conn)
    return [claimer.claim(limit) for _ in range(n)]


def take(model: dict[str, Row], got: list[str], now: float) -> None:
    """The model after a claim of ``got``: running, under a live lease."""
    for run_id in got:
        b = model[run_id]
        model[run_id] = Row(run_id, b.tenant, b.target, "running", b.available_at,
                            lease_expires_at=now + 3600)  # fmt: skip


def claimable_sql() -> str:
    """The claimable runs of ``%(targets)s`` other than ``%(mine)s``, by the server's
    clock (psycopg placeholders)."""
    now = "extract(epoch FROM statement_timestamp())::float8"
    return (
        "SELECT id FROM runs WHERE target = ANY(%(targets)s) AND ((status IN ('queued', "
        f"'waiting') AND available_at <= {now}) OR (status = 'running' AND "
        f"lease_expires_at < {now})) AND id <> ALL(%(mine)s)"
    )


class ClaimRace:
    """Claimers on their own connections, each claiming until nothing is left; records
    who took what and every broken rule (a run claimed twice, a short claim that left
    an unheld claimable run, an error in a thread)."""

    def __init__(self) -> None:
        self.taken: dict[str, str] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def record(self, who: str, ids: list[str]) -> None:
        with self.lock:
            for run_id in ids:
                if run_id in self.taken:
                    self.errors.append(f"{run_id} claimed by {self.taken[run_id]} and {who}")
                self.taken[run_id] = who

    def work(self, c: Claimer, limit: int, seed: int, pause: float) -> None:
        """Claim (keeping each claim's transaction open up to ``pause`` seconds) until
        a claim takes nothing."""
        r = random.Random(seed)
        try:
            while True:
                got = c.claim(limit, commit=False)
                if len(got) < limit:
                    left = c.conn.execute(claimable_sql() + " FOR UPDATE SKIP LOCKED",
                                          {"targets": TARGETS, "mine": got}).fetchall()  # fmt: skip
                    if left:
                        self.errors.append(f"{c.name} short ({got}) with {left} unheld")
                self.record(c.name, got)
                time.sleep(r.random() * pause)
                c.conn.commit()
                if not got:
                    return
        except Exception as exc:  # a failed thread fails the test
            self.errors.append(repr(exc))


def explain_claim(url: str, conn: Any, limit: int, targets: list[str]) -> dict[str, Any]:
    """The claim's plan, run (EXPLAIN ANALYZE) and rolled back."""
    sql = convert_placeholders("EXPLAIN (ANALYZE, FORMAT JSON) "
                               + PostgresDialect(url).claim_sql(len(targets)))  # fmt: skip
    row = conn.execute(sql, claim_params("w", limit, targets)).fetchone()
    conn.rollback()
    assert row is not None
    value = next(iter(row.values())) if isinstance(row, dict) else row[0]
    plan: dict[str, Any] = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
    return plan


def rows_read(node: dict[str, Any]) -> int:
    """Rows every scan of the plan read: returned plus removed by a filter."""
    total = 0
    if "Scan" in node.get("Node Type", ""):
        loops = node.get("Actual Loops", 0)
        total += int((node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops)
    for child in node.get("Plans", []):
        total += rows_read(child)
    return total


def ctes(node: dict[str, Any], found: dict[str, int] | None = None) -> dict[str, int]:
    """Each CTE of the plan and how many times it was started (Actual Loops)."""
    found = {} if found is None else found
    name = node.get("Subplan Name", "")
    if name.startswith("CTE "):
        found[name[4:]] = int(node.get("Actual Loops", 0))
    for child in node.get("Plans", []):
        ctes(child, found)
    return found
