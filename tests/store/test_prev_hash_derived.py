"""A sealed record's previous hash is the record before it's own hash: stored or not
(``events.prev_hash`` NULL, as sealers that no longer store it leave it), the chain
verifies, a prune checks and removes its front, and the audit listing shows the same
``prev_hash`` as when it was stored; a record edited or removed is still found
(docs/architecture.md, "The audit chain")."""

from __future__ import annotations

from typing import Any

from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from tests.store.test_prune import _finished, keyed, run_cli

__all__ = ["keyed"]  # the fixture, used by name


async def _listing(store: Store, tenant: str) -> list[dict[str, Any]]:
    return await store.read(service_audit.audit_records, tenant, None, 0, 1000)


async def _by_run(store: Store, tenant: str, run_id: str) -> list[dict[str, Any]]:
    return await store.read(service_audit.audit_records, tenant, run_id, 0, 1000)


async def _forget_prev(store: Store) -> None:
    await store.transact(lambda tx: tx.execute("UPDATE events SET prev_hash = NULL"))


async def test_records_without_a_stored_previous_hash_verify_and_prune(
    keyed: None, store: Store, store_url: str
) -> None:
    old = await _finished(store, "t1", 2)
    kept = await _finished(store, "t1", 1)
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE steps SET status = 'unknown' WHERE run_id = :r", {"r": kept[0]}
        )
    )
    assert (await run_cli("audit", "verify", "--db", store_url)).exit_code == 0
    listed = await _listing(store, "t1")
    of_run = await _by_run(store, "t1", kept[0])
    assert listed and all(r["prev_hash"] is not None for r in listed)

    await _forget_prev(store)
    assert await _listing(store, "t1") == listed
    assert await _by_run(store, "t1", kept[0]) == of_run
    ok = await run_cli("audit", "verify", "--db", store_url)
    assert ok.exit_code == 0, ok.output

    pruned = await run_cli("prune", "--older-than", "0s", "--tenant", "t1", "--db", store_url)
    assert pruned.exit_code == 0 and "removed 2 runs" in pruned.output, pruned.output
    assert old
    after = await _listing(store, "t1")
    # The first record left follows the pruned span: its previous hash is the summary's.
    assert after == [r for r in listed if r["run_id"] == kept[0]]
    ok = await run_cli("audit", "verify", "--db", store_url)
    assert ok.exit_code == 0 and "records pruned" in ok.output, ok.output


async def test_an_edit_or_a_removal_is_found_without_stored_previous_hashes(
    keyed: None, store: Store, store_url: str
) -> None:
    await _finished(store, "t1", 2)
    await _forget_prev(store)
    assert (await run_cli("audit", "verify", "--db", store_url)).exit_code == 0

    # A record removed and the ones after it renumbered: each is hashed over the
    # previous record's hash, so the record after the gap no longer matches.
    await store.transact(
        lambda tx: (
            tx.execute("DELETE FROM events WHERE tenant_id = 't1' AND chain_no = 3"),
            tx.execute(
                "UPDATE events SET chain_no = chain_no - 1 WHERE tenant_id = 't1' AND chain_no > 3"
            ),
        )
    )
    removed = await run_cli("audit", "verify", "--db", store_url)
    assert removed.exit_code == 1 and "TAMPERED" in removed.output, removed.output
    assert "record 3" in removed.output


async def test_an_edited_record_is_found_without_stored_previous_hashes(
    keyed: None, store: Store, store_url: str
) -> None:
    await _finished(store, "t1", 1)
    await _forget_prev(store)
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE events SET data = '{\"edited\":true}' WHERE tenant_id = 't1' AND chain_no = 2"
        )
    )
    edited = await run_cli("audit", "verify", "--db", store_url)
    assert edited.exit_code == 1 and "TAMPERED" in edited.output, edited.output
    assert "record 2" in edited.output
