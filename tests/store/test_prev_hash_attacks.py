"""Tampering with a chain whose records do not store their previous hash
(``events.prev_hash`` NULL): ``audit verify`` and ``prune`` still name the break, and the
audit listing derives each previous hash from the tenant's own chain -- after a pruned
span, from the span's signed summary -- never from a record a writer of the database
put where the chain has none (docs/architecture.md, "The audit chain")."""

from __future__ import annotations

from typing import Any

import pytest

from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from tests.store.test_prune import _finished, keyed, run_cli

__all__ = ["keyed"]  # the fixture, used by name


async def _forget_prev(store: Store) -> None:
    await store.transact(lambda tx: tx.execute("UPDATE events SET prev_hash = NULL"))


async def _listing(store: Store, tenant: str, after: int = 0, limit: int = 1000) -> list[Any]:
    return await store.read(service_audit.audit_records, tenant, None, after, limit)


async def _rows(store: Store, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    return [dict(r) for r in await store.read(lambda tx: tx.fetchall(sql, params or {}))]


_COPY = (
    "INSERT INTO events (run_id, seq, type, actor, at, data, tenant_id, chain_no, prev_hash, "
    "hash, sig, hash_v) SELECT run_id, seq + 1000, type, actor, at, data, tenant_id, :n, NULL, "
    ":h, sig, hash_v FROM events WHERE tenant_id = :t AND chain_no = :from"
)


async def _pruned_then_forged(store: Store, store_url: str) -> dict[str, Any]:
    """Prune t1's first two runs, forget every stored previous hash, then write a record
    at the pruned span's last position (a copy of the first record left, its hash made
    up): the chain has no record there any more. Returns the span's summary."""
    await _finished(store, "t1", 2)
    kept = await _finished(store, "t1", 1)
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE steps SET status = 'unknown' WHERE run_id = :r", {"r": kept[0]}
        )
    )
    pruned = await run_cli("prune", "--older-than", "0s", "--tenant", "t1", "--db", store_url)
    assert pruned.exit_code == 0 and "removed 2 runs" in pruned.output, pruned.output
    await _forget_prev(store)
    (summary,) = await _rows(store, "SELECT last_chain_no, last_hash FROM audit_pruned")
    last = int(summary["last_chain_no"])
    listed = await _listing(store, "t1")
    assert listed[0]["chain_no"] == last + 1 and listed[0]["prev_hash"] == summary["last_hash"]
    await store.transact(
        lambda tx: tx.execute(_COPY, {"n": last, "h": "f" * 64, "t": "t1", "from": last + 1})
    )
    return summary


async def test_the_listing_takes_the_previous_hash_after_a_pruned_span_from_its_summary(
    keyed: None, store: Store, store_url: str
) -> None:
    summary = await _pruned_then_forged(store, store_url)
    last = int(summary["last_chain_no"])
    for after in (0, last):
        first = next(r for r in await _listing(store, "t1", after) if r["chain_no"] == last + 1)
        assert first["prev_hash"] == summary["last_hash"], after


async def test_a_record_inside_the_pruned_span_is_named(
    keyed: None, store: Store, store_url: str
) -> None:
    summary = await _pruned_then_forged(store, store_url)
    found = await run_cli("audit", "verify", "--db", store_url)
    assert found.exit_code == 1 and "TAMPERED" in found.output, found.output
    assert f"record {summary['last_chain_no']}" in found.output, found.output


async def _hashed_over(store: Store, records: list[dict[str, Any]]) -> list[int]:
    """Chain positions of ``records`` whose listed ``prev_hash`` is not the one their
    hash was made over (in the chain that holds them)."""
    wrong = []
    for r in records:
        if r["chain_no"] is None or r["prev_hash"] is None:
            continue
        (row,) = await _rows(store, "SELECT * FROM events WHERE id = :i", {"i": r["id"]})
        made = service_audit.record_hash(
            str(r["prev_hash"]), row["tenant_id"], row, int(row["chain_no"]),
            version=row["hash_v"],
        )  # fmt: skip
        if made != row["hash"]:
            wrong.append(int(r["chain_no"]))
    return wrong


async def test_a_run_moved_to_another_tenant_lists_no_previous_hash_of_the_wrong_chain(
    keyed: None, store: Store, store_url: str
) -> None:
    _, moved = await _finished(store, "t2", 2)
    _, own = await _finished(store, "t1", 2)
    await _forget_prev(store)
    # A writer of the database moves t2's run into t1 (`audit verify` names such a run):
    # its records are still in t2's chain, at positions t1's chain has records at too.
    await store.transact(
        lambda tx: tx.execute("UPDATE runs SET tenant_id = 't1' WHERE id = :r", {"r": moved})
    )
    listed = await store.read(service_audit.audit_records, "t1", moved, 0, 1000)
    assert listed and await _hashed_over(store, listed) == []
    t2 = {r["hash"] for r in await _rows(store, "SELECT hash FROM events WHERE tenant_id = 't2'")}
    shown = {r["hash"] for r in listed}
    assert not {r["prev_hash"] for r in listed} & (t2 - shown), "another tenant's hash"
    of_own = await store.read(service_audit.audit_records, "t1", own, 0, 1000)
    assert of_own and all(r["prev_hash"] for r in of_own)
    assert await _hashed_over(store, of_own) == []


async def test_a_run_listing_derives_over_a_thousand_previous_hashes_across_pages(
    store: Store,
) -> None:
    # A run's records interleaved with another's in the chain: none of their previous
    # records is on the page, so each is looked up (more than two statements' worth).
    (run_id,) = await _finished(store, "t1", 1, steps=1)
    (other,) = await _finished(store, "t1", 1, steps=1)
    (top,) = await _rows(store, "SELECT MAX(chain_no) AS n FROM events WHERE tenant_id = 't1'")
    base = int(top["n"])

    # 2,400 records in one statement (run_id's at odd i, other's at even i; record n's
    # hash is n in 64 hex digits), not a round trip each.
    hexed = {"postgres": "lpad(to_hex(:base + i), 64, '0')",
             "sqlite": "printf('%064x', :base + i)"}[store.dialect.name]  # fmt: skip

    def forged(tx: Any) -> None:
        tx.execute(
            "INSERT INTO events (run_id, seq, type, actor, at, data, tenant_id, chain_no, "
            "prev_hash, hash, hash_v) WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL "
            "SELECT i + 1 FROM g WHERE i < 2400) SELECT CASE WHEN i % 2 = 1 THEN :r "
            f"ELSE :o END, 1000 + i, 'x', 'a', 0, NULL, 't1', :base + i, NULL, {hexed}, 2 "
            "FROM g",
            {"r": run_id, "o": other, "base": base},
        )

    await store.transact(forged)
    assert len(await _rows(store, "SELECT seq FROM events WHERE run_id = :r AND seq > 1000",
                           {"r": run_id})) == 1200  # fmt: skip
    await _forget_prev(store)
    (last,) = await _rows(
        store, "SELECT hash FROM events WHERE tenant_id = 't1' AND chain_no = :n", {"n": base}
    )
    seen: list[dict[str, Any]] = []
    after = 1000
    while True:
        page = await store.read(service_audit.audit_records, "t1", run_id, after, 700)
        if not page:
            break
        seen.extend(page)
        after = int(page[-1]["seq"])
    assert len(seen) == 1200
    for r in seen:
        n = int(r["chain_no"])
        assert r["prev_hash"] == (last["hash"] if n == base + 1 else f"{n - 1:064x}"), n


# Tampering with a chain of t1 (two finished runs, t2 one) whose stored previous hashes
# are all NULL, each with the chain position `audit verify` must name.
_TAMPER = {
    "edit data at 1": (
        ["UPDATE events SET data = '{}' WHERE tenant_id = 't1' AND chain_no = 1"], 1
    ),
    "edit type": (["UPDATE events SET type = 'run.x' WHERE tenant_id = 't1' AND chain_no = 4"], 4),
    "edit actor": (["UPDATE events SET actor = 'm' WHERE tenant_id = 't1' AND chain_no = 6"], 6),
    "swap two": (
        [
            "UPDATE events SET chain_no = -3 WHERE tenant_id = 't1' AND chain_no = 3",
            "UPDATE events SET chain_no = 3 WHERE tenant_id = 't1' AND chain_no = 4",
            "UPDATE events SET chain_no = 4 WHERE tenant_id = 't1' AND chain_no = -3",
        ],
        3,
    ),
    "a copy inserted": (
        [
            "UPDATE events SET chain_no = chain_no + 1000 WHERE tenant_id = 't1' "
            "AND chain_no > 2",
            "UPDATE events SET chain_no = chain_no - 999 WHERE tenant_id = 't1' "
            "AND chain_no > 1000",
            _COPY.replace(":n", "3").replace(":h", "'" + "e" * 64 + "'")
            .replace(":t", "'t1'").replace(":from", "2"),
            "UPDATE audit_heads SET chain_no = chain_no + 1 WHERE tenant_id = 't1'",
        ],
        3,
    ),
    "another tenant's record": (
        ["UPDATE events SET tenant_id = 't1', chain_no = 1000 WHERE tenant_id = 't2' "
         "AND chain_no = 2",
         "UPDATE events SET tenant_id = 't2', chain_no = 2 WHERE tenant_id = 't1' "
         "AND chain_no = 2",
         "UPDATE events SET tenant_id = 't1', chain_no = 2 WHERE tenant_id = 't1' "
         "AND chain_no = 1000"],
        2,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(_TAMPER))
async def test_tampering_without_stored_previous_hashes_is_named(
    keyed: None, store: Store, store_url: str, case: str
) -> None:
    await _finished(store, "t1", 2)
    await _finished(store, "t2", 1)
    await _forget_prev(store)
    assert (await run_cli("audit", "verify", "--db", store_url)).exit_code == 0
    statements, at = _TAMPER[case]

    def tamper(tx: Any) -> None:
        for sql in statements:
            tx.execute(sql)

    await store.transact(tamper)
    found = await run_cli("audit", "verify", "--db", store_url)
    assert found.exit_code == 1 and "TAMPERED" in found.output, found.output
    assert f"tenant t1, record {at} " in found.output, found.output
    # A prune of t1 removes nothing from the record on (it stops before it, or its run
    # is not prunable) and never summarizes it: `audit verify` still names it.
    counted = "SELECT COUNT(*) AS n FROM events WHERE tenant_id = 't1' AND chain_no >= :n"
    before = await _rows(store, counted, {"n": at})
    got = await run_cli("prune", "--older-than", "0s", "--tenant", "t1", "--db", store_url)
    assert got.exit_code in (0, 1), got.output
    assert await _rows(store, counted, {"n": at}) == before
    again = await run_cli("audit", "verify", "--db", store_url)
    assert again.exit_code == 1 and f"tenant t1, record {at} " in again.output, again.output


async def test_a_record_before_the_chain_s_first_position_is_named(
    keyed: None, store: Store, store_url: str
) -> None:
    await _finished(store, "t1", 1)
    await _forget_prev(store)
    await store.transact(
        lambda tx: tx.execute(_COPY, {"n": 0, "h": "f" * 64, "t": "t1", "from": 1})
    )
    found = await run_cli("audit", "verify", "--db", store_url)
    assert found.exit_code == 1 and "tenant t1, record 0 " in found.output, found.output
