"""A tenant's search results -- which chunks, their order, every score -- depend on that
tenant's documents alone: another tenant adding documents with or without the query's
words changes nothing a tenant sees, keyword and hybrid, on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentledger.retrieval import index_path
from agentledger.retrieval._tools import search_docs
from agentledger.store import Store
from agentledger.tools._context import ToolContext

A_DOC = """# Clinic notes

## Visits
The patient visit is booked for Monday; the visit lasts an hour.

## Results
Blood results arrive within two days of the visit.

## Billing
Invoices are sent after each appointment.
"""

QUERIES = ["visit results", "patient visit Monday", "invoices appointment", "blood"]


async def outputs(store: Store, tenant: str) -> str:
    ctx = ToolContext("r", 1, "r:1", 1e18, tenant, "u1", store=store)
    found = [await search_docs.call(ctx, {"query": q, "k": 5}) for q in QUERIES]
    return json.dumps(found, sort_keys=True)


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
async def test_another_tenants_documents_change_nothing_a_tenant_sees(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    if mode == "keyword":
        monkeypatch.setenv("AGENTLEDGER_EMBEDDINGS", "0")
    else:
        pytest.importorskip("wordllama", reason="the embeddings extra is not installed")
        monkeypatch.delenv("AGENTLEDGER_EMBEDDINGS", raising=False)
    a = tmp_path / "a.md"
    a.write_text(A_DOC)
    await index_path(store, a, "clinic-a")
    before = await outputs(store, "clinic-a")
    assert '"score"' in before and before.count("chunk_id") >= 4
    # Tenant B: documents full of A's query words, then documents without them.
    for i in range(6):
        b = tmp_path / f"b{i}.md"
        words = "visit visit results blood patient" if i % 2 else "weather report sunny"
        b.write_text(f"# B {i}\n\n## Part\n{words} {'filler ' * (i * 20)}\n")
        await index_path(store, b, "clinic-b")
        assert await outputs(store, "clinic-a") == before, f"after B's document {i}"
