"""Per-user memory in the store, on both backends: scoped by tenant and user, idempotent
writes, and forgetting that deletes the rows (checked with SQL) and is audited."""

from __future__ import annotations

from agentledger.memory import _queries as memory_facts
from agentledger.memory import fact_key_of, rank_facts
from agentledger.memory._queries import memory_audit_id
from agentledger.memory._tools import recall, remember, remember_status
from agentledger.store import Store
from agentledger.tools._context import ToolContext
from tests.memory.runs import count


def ctx(store: Store, tenant: str, user: str | None, key: str = "r1:3") -> ToolContext:
    return ToolContext(
        run_id=key.split(":")[0],
        step_no=int(key.split(":")[1]),
        idempotency_key=key,
        deadline=1e18,
        tenant_id=tenant,
        user_id=user,
        store=store,
    )


async def test_facts_are_scoped_by_tenant_and_user(store: Store) -> None:
    await store.transact(
        memory_facts.upsert_fact, "acme", "u1", "room", "prefers quiet rooms", "r1", "r1:2"
    )
    await store.transact(
        memory_facts.upsert_fact, "acme", "u2", "room", "likes the top floor", "r2", "r2:2"
    )
    await store.transact(
        memory_facts.upsert_fact, "globex", "u1", "room", "allergic to feathers", "r3", "r3:2"
    )
    assert [f.fact for f in await store.read(memory_facts.list_facts, "acme", "u1")] == [
        "prefers quiet rooms"
    ]
    assert [f.fact for f in await store.read(memory_facts.list_facts, "globex", "u1")] == [
        "allergic to feathers"
    ]
    everywhere = await store.read(memory_facts.all_facts, None, "u1")  # operators: every tenant
    assert sorted(f.tenant_id for f in everywhere) == ["acme", "globex"]


async def test_the_same_key_updates_in_place(store: Store, store_url: str) -> None:
    first = await store.transact(
        memory_facts.upsert_fact, "t", "u", "room", "prefers quiet rooms", "r1", "r1:2"
    )
    second = await store.transact(
        memory_facts.upsert_fact, "t", "u", "room", "prefers a sea view", "r2", "r2:4"
    )
    assert second.id == first.id and second.created_at == first.created_at
    assert second.fact == "prefers a sea view" and second.source_key == "r2:4"
    assert count(store_url, "SELECT COUNT(*) FROM memory_facts") == 1


async def test_remember_tool_retried_with_its_key_stores_once(store: Store, store_url: str) -> None:
    context = ctx(store, "acme", "u1", "run-a:3")
    assert (await remember_status(context, {})).state == "not_found"
    out1 = await remember.call(context, {"fact": "Prefers  quiet\nrooms", "key": None})
    out2 = await remember.call(context, {"fact": "Prefers  quiet\nrooms", "key": None})
    assert out1 == out2
    assert out1["remembered"]["fact"] == "Prefers quiet rooms"
    assert out1["remembered"]["key"] == fact_key_of("prefers quiet rooms")
    assert count(store_url, "SELECT COUNT(*) FROM memory_facts") == 1
    status = await remember_status(context, {})
    assert status.state == "succeeded" and status.result == out1
    # The status check is scoped too: another tenant's step with the same key finds nothing.
    assert (await remember_status(ctx(store, "globex", "u1", "run-a:3"), {})).state == ("not_found")


async def test_recall_reads_only_the_runs_tenant_and_user(store: Store) -> None:
    await store.transact(
        memory_facts.upsert_fact, "acme", "u1", "room", "prefers quiet rooms", "r1", "r1:2"
    )
    await store.transact(
        memory_facts.upsert_fact, "acme", "u1", "diet", "vegetarian breakfast", "r1", "r1:4"
    )
    await store.transact(
        memory_facts.upsert_fact, "globex", "u1", "room", "prefers noisy rooms", "r2", "r2:2"
    )
    found = await recall.call(ctx(store, "acme", "u1"), {"query": "which rooms?", "k": 5})
    assert [f["fact"] for f in found["facts"]] == ["prefers quiet rooms"]
    assert (await recall.call(ctx(store, "initech", "u1"), {"query": "", "k": 5})) == {"facts": []}


async def test_forget_one_key_deletes_that_row_and_audits_without_key_or_text(
    store: Store, store_url: str
) -> None:
    await store.transact(
        memory_facts.upsert_fact, "acme", "u1", "room", "prefers quiet rooms", "r1", "r1:2"
    )
    await store.transact(
        memory_facts.upsert_fact, "acme", "u1", "diet", "vegetarian breakfast", "r1", "r1:4"
    )
    await store.transact(
        memory_facts.upsert_fact, "globex", "u1", "room", "prefers quiet rooms", "r2", "r2:2"
    )
    assert await store.transact(memory_facts.forget_facts, "acme", "u1", "room", "cli:ops") == (
        1,
        0,
    )
    sql = "SELECT COUNT(*) FROM memory_facts WHERE tenant_id = ? AND user_id = ? AND fact_key = ?"
    assert count(store_url, sql, ("acme", "u1", "room")) == 0
    assert count(store_url, sql, ("acme", "u1", "diet")) == 1
    assert count(store_url, sql, ("globex", "u1", "room")) == 1  # another tenant: kept
    events = await store.list_events(memory_audit_id("acme", "u1"))
    assert [(e.type, e.actor) for e in events] == [("memory.forgotten", "cli:ops")]
    assert events[0].data["deleted"] == 1 and len(events[0].data["digest"]) == 64
    assert "quiet" not in str(events[0].data) and "room" not in str(events[0].data)


async def test_forget_all_deletes_every_row_of_the_user_in_the_tenant(
    store: Store, store_url: str
) -> None:
    for n in range(3):
        await store.transact(
            memory_facts.upsert_fact, "acme", "u1", f"k{n}", f"fact {n}", "r1", f"r1:{n}"
        )
    await store.transact(memory_facts.upsert_fact, "acme", "u2", "k", "someone else", "r2", "r2:1")
    assert await store.transact(memory_facts.forget_facts, "acme", "u1", None, "cli") == (3, 0)
    assert count(store_url, "SELECT COUNT(*) FROM memory_facts WHERE user_id = 'u1'") == 0
    assert count(store_url, "SELECT COUNT(*) FROM memory_facts WHERE user_id = 'u2'") == 1
    assert await store.transact(memory_facts.forget_facts, "acme", "u1", None, "cli") == (
        0,
        0,
    )  # again: nothing more


def test_rank_facts_prefers_more_shared_words_then_newer() -> None:
    from agentledger.memory._queries import Fact

    def fact(key: str, text: str, at: float) -> Fact:
        return Fact(key, "t", "u", key, text, None, None, at, at)

    facts = [
        fact("a", "likes quiet rooms", 3),
        fact("b", "quiet rooms high floor", 2),
        fact("c", "vegetarian", 1),
    ]
    assert [f.fact_key for f in rank_facts(facts, "quiet room on a high floor", 5)] == ["b", "a"]
    assert [f.fact_key for f in rank_facts(facts, "", 2)] == ["a", "b"]
