"""Tampering with a chain whose records do not store their previous hash
(``events.prev_hash`` NULL): ``audit verify`` and ``prune`` still name the break, and the
audit listing derives each previous hash from the tenant's own chain -- after a pruned
span, from the span's signed summary -- never from a record a writer of the database
put where the chain has none (docs/architecture.md, "The audit chain")."""

from __future__ import annotations

from typing import Any

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
