"""Events audited under no run (a tenant's document changes, a user's memory changes)
are chained into their tenant's audit chain like a run's events, so editing one is
detected; an old one with neither a run nor a tenant never blocks the sealing of the
others."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from agentledger import _sealer as sealer
from agentledger.memory import _queries as memory_facts
from agentledger.retrieval import _queries as retrieval_docs
from agentledger.retrieval._queries import NewChunk
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from tests.service import service_app
from tests.service.conftest import in_process, settings_for


async def _rows(store: Store, where: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    return await store.read(lambda tx: tx.fetchall(
            f"SELECT id, run_id, type, tenant_id, chain_no, hash FROM events WHERE {where}",
            params,
        ))  # fmt: skip


async def _add_doc(store: Store, tenant: str, source: str) -> None:
    text = f"{source}: check-in is at three"
    await store.transact(retrieval_docs.add_document,
        tenant, source, source, "text", hashlib.sha256(text.encode()).hexdigest(),
        [NewChunk("Policy", text)], "ops:alice",
    )  # fmt: skip


async def test_document_and_memory_changes_are_chained_in_their_tenants(store: Store) -> None:
    await _add_doc(store, "t1", "policy.md")
    await store.transact(retrieval_docs.remove_document, "t1", "policy.md", "ops:alice")
    await store.transact(memory_facts.forget_facts, "t2", "bob", None, "ops:carol")
    run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
    assert await store.read(service_audit.has_unsealed) is True
    assert (await store.read(service_audit.unsealed_tail, "t2"))[0] == 1  # fmt: skip
    await sealer.seal_once(store)
    checked, broken = await store.read(service_audit.verify_chain)
    assert broken == [] and checked >= 4
    runless = await _rows(store, "run_id NOT IN (SELECT id FROM runs)", {})
    assert sorted((r["type"], r["tenant_id"]) for r in runless) == [
        ("docs.added", "t1"), ("docs.removed", "t1"), ("memory.forgotten", "t2"),
    ]  # fmt: skip
    assert all(r["hash"] is not None and r["chain_no"] is not None for r in runless)
    # In the tenant's chain, in sealing order, between its runs' records.
    t1 = await store.read(service_audit.audit_records, "t1", None, 0, 100)
    assert [r["type"] for r in t1][:2] == ["docs.added", "docs.removed"]
    assert [r["chain_no"] for r in t1] == list(range(1, len(t1) + 1))
    assert any(r["run_id"] == run_id for r in t1)
    assert await store.read(service_audit.has_unsealed) is False
    assert await store.read(service_audit.unsealed_tail) == (0, None)


async def test_editing_a_memory_record_breaks_its_tenants_chain(store: Store) -> None:
    await store.transact(memory_facts.forget_facts, "t1", "bob", "diet", "ops:carol")
    await _add_doc(store, "t2", "faq.md")
    await sealer.seal_once(store)
    (forgotten,) = await _rows(store, "type = 'memory.forgotten'", {})
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE events SET actor = 'nobody' WHERE id = :id", {"id": forgotten["id"]}
        )
    )
    _, broken = await store.read(service_audit.verify_chain)
    assert [(b.tenant_id, b.event_id) for b in broken] == [("t1", forgotten["id"])]


async def test_events_under_no_run_and_no_tenant_do_not_stop_the_sealer(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sealer, "BATCH", 3)  # a round's batch: 3 records, not 500
    # More than a round's worth of events that name no run and no tenant.
    for i in range(sealer.BATCH * sealer.MAX_BATCHES + 1):
        await store.transact(
            lambda tx, i=i: tx.execute(
                "INSERT INTO events (run_id, at, type, actor, data) "
                "VALUES (:r, 0, 'note.added', 'ops', '{}')", {"r": f"note/{i}"},
            )
        )  # fmt: skip
    await store.transact(memory_facts.forget_facts, "t1", "u1", None, "ops:alice")
    run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
    for _ in range(3):  # rounds: sealing is not starved by the older tenantless ones
        await sealer.seal_once(store)
    checked, broken = await store.read(service_audit.verify_chain)
    assert broken == [] and checked >= 2
    events = await _rows(store, "run_id = :r OR type = 'memory.forgotten'", {"r": run_id})
    assert events and all(e["hash"] is not None for e in events), events
    # Nothing left to seal: sealers do not keep opening write transactions, and
    # `audit verify --max-unsealed-age` does not fail on the tenantless ones.
    assert await store.read(service_audit.has_unsealed) is False
    assert await store.read(service_audit.unsealed_tail) == (0, None)


async def test_the_migration_gives_older_runless_events_their_tenant(store: Store) -> None:
    await _add_doc(store, "t/1", "policy.md")
    await store.transact(memory_facts.forget_facts, "t2", "bob/x", None, "ops:carol")
    # As written before events under no run carried their tenant.
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE events SET tenant_id = NULL WHERE run_id NOT IN (SELECT id FROM runs)"
        )
    )
    assert await store.read(service_audit.has_unsealed) is False
    await store.transact(lambda tx: tx.execute("DELETE FROM schema_migrations WHERE version = 72"))
    await store.migrate()
    runless = await _rows(store, "run_id NOT IN (SELECT id FROM runs)", {})
    assert sorted((r["type"], r["tenant_id"]) for r in runless) == [
        ("docs.added", "t/1"), ("memory.forgotten", "t2"),
    ]  # fmt: skip
    await sealer.seal_once(store)
    checked, broken = await store.read(service_audit.verify_chain)
    assert broken == [] and checked == 2


async def test_an_admin_lists_memory_changes_in_the_tenants_audit(store_url: str) -> None:
    async with in_process(settings_for(store_url)) as api:
        admin = await api.key("t1", "alice", ("admin",))
        other = await api.key("t2", "eve", ("admin",))
        await api.store.transact(memory_facts.forget_facts, "t1", "bob", None, "ops:carol")
        await sealer.seal_once(api.store)
        records = (await api.client.get("/v1/audit", headers=admin)).json()["records"]
        assert [(r["type"], r["run_id"], r["actor"]) for r in records] == [
            ("memory.forgotten", "memory/t1/bob", "ops:carol")
        ]
        assert (await api.client.get("/v1/audit", headers=other)).json()["records"] == []
