"""Documents indexed and searched in the store, on both backends (SQLite FTS5,
PostgreSQL tsvector + GIN): tenant-scoped, replaced in place, removed for real."""

from __future__ import annotations

from pathlib import Path

from agentledger.retrieval import _queries as retrieval_docs
from agentledger.retrieval import index_path
from agentledger.retrieval._queries import docs_audit_id, query_terms
from agentledger.retrieval._tools import search_docs
from agentledger.store import Store
from agentledger.tools._context import ToolContext
from agentledger_examples.stayhub.knowledge import POLICY_SOURCE, index_policy
from tests.memory.runs import count


def tool_ctx(store: Store, tenant: str) -> ToolContext:
    return ToolContext("r", 1, "r:1", 1e18, tenant, "u1", store=store)


async def test_the_free_cancellation_passage_answers_the_question(store: Store) -> None:
    doc, changed = await index_policy(store, "acme")
    assert changed and doc.source == POLICY_SOURCE and doc.chunks >= 8
    hits = await store.read(retrieval_docs.search_chunks, "acme", "Can I cancel for free?", 3)
    assert hits[0].heading.endswith("Free cancellation")
    assert hits[0].chunk_id.startswith(doc.id + "#") and hits[0].document_id == doc.id
    assert "48 hours" in hits[0].text
    refund = await store.read(retrieval_docs.search_chunks, "acme", "when do I get my refund", 1)
    assert refund[0].heading.endswith("When will I get my refund?")


async def test_search_never_crosses_tenants(store: Store) -> None:
    await index_policy(store, "acme")
    assert await store.read(retrieval_docs.search_chunks, "globex", "cancel for free", 5) == []
    out = await search_docs.call(tool_ctx(store, "globex"), {"query": "cancel", "k": 4})
    assert out == {"query": "cancel", "results": []}
    out = await search_docs.call(tool_ctx(store, "acme"), {"query": "cancel", "k": 2})
    assert len(out["results"]) == 2 and {"chunk_id", "document_id"} <= set(out["results"][0])


async def test_queries_with_operators_or_no_words_are_safe(store: Store) -> None:
    await index_policy(store, "acme")
    for query in ['cancel" OR *', "NEAR(cancel", "-free & | !", "", "???", "the and of"]:
        await store.read(retrieval_docs.search_chunks, "acme", query, 3)  # never a syntax error
    assert query_terms("Can I cancel for FREE? cancel") == ["cancel", "free"]


async def test_adding_again_is_unchanged_and_new_content_replaces(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "faq.md"
    path.write_text("# FAQ\n\n## Pets\n\nDogs are welcome.\n")
    first, changed = await index_path(store, path, "acme")
    again, changed_again = await index_path(store, path, "acme")
    assert changed and not changed_again and again.id == first.id
    path.write_text("# FAQ\n\n## Pets\n\nCats only.\n")
    second, changed = await index_path(store, path, "acme")
    assert changed and second.id != first.id
    assert await store.read(retrieval_docs.search_chunks, "acme", "dogs", 3) == []
    assert [
        h.document_id for h in await store.read(retrieval_docs.search_chunks, "acme", "cats", 3)
    ] == [second.id]
    assert count(store_url, "SELECT COUNT(*) FROM documents") == 1
    assert count(store_url, "SELECT COUNT(*) FROM doc_chunks") == second.chunks
    events = await store.list_events(docs_audit_id("acme"))
    assert [e.type for e in events] == ["docs.added", "docs.replaced"]


async def test_remove_deletes_the_rows_and_the_index(store: Store, store_url: str) -> None:
    acme, _ = await index_policy(store, "acme")
    await index_policy(store, "globex")
    assert await store.transact(retrieval_docs.remove_document, "acme", POLICY_SOURCE, "cli") == 1
    assert await store.transact(retrieval_docs.remove_document, "acme", acme.id, "cli") == 0
    assert count(store_url, "SELECT COUNT(*) FROM doc_chunks WHERE tenant_id = 'acme'") == 0
    assert count(store_url, "SELECT COUNT(*) FROM documents WHERE tenant_id = 'acme'") == 0
    assert await store.read(retrieval_docs.search_chunks, "acme", "cancel", 5) == []
    assert len(await store.read(retrieval_docs.search_chunks, "globex", "cancel", 5)) == 5
    if store_url.startswith("sqlite"):  # the FTS5 index forgot the rows too
        left = count(
            store_url, "SELECT COUNT(*) FROM doc_chunks_fts WHERE doc_chunks_fts MATCH 'cancel'"
        )
        globex_matches = count(
            store_url,
            "SELECT COUNT(*) FROM doc_chunks c WHERE c.tenant_id = 'globex' "
            "AND c.seq IN (SELECT rowid FROM doc_chunks_fts WHERE doc_chunks_fts MATCH 'cancel')",
        )
        assert left == globex_matches
    assert [d.tenant_id for d in await store.read(retrieval_docs.list_documents)] == ["globex"]


async def test_the_retrieval_bench_runs_and_cleans_up(tmp_path: Path) -> None:
    from agentledger.retrieval._embeddings import embedder
    from agentledger.store import open_store
    from agentledger_bench.retrieval import measure

    url = f"sqlite:///{tmp_path / 'bench.db'}"
    result = await measure(url, n=120, queries=20, k=3, chars=300)
    assert result["chunks"] == 120 and result["mean_hits"] > 0 and result["p95_ms"] > 0
    if embedder() is not None:  # the embeddings extra: the hybrid figures too
        assert result["hybrid_p95_ms"] > 0 and result["embedder"] == embedder().name  # type: ignore[union-attr]
    store = open_store(url)
    await store.open()
    try:
        assert await store.read(retrieval_docs.list_documents) == []
    finally:
        await store.close()
