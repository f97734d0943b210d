"""Optional embeddings: the model loads offline from its wheel, chunks are embedded into
the store, and searches fuse full text with cosine similarity, on both stores, one
tenant's vectors never reaching another's search. Skipped when the extra is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentledger.retrieval import _queries as retrieval_docs
from agentledger.retrieval import index_path, search
from agentledger.retrieval._embeddings import embedder
from agentledger.store._sqlstore import Store

pytest.importorskip("wordllama", reason="the embeddings extra is not installed")

POLICY = """# Booking policy

## Changes
Guests may call off a reservation without charge until noon the day before arrival.

## Breakfast
Breakfast is served from seven until ten in the dining room.

## Animals
Pets are welcome in every room for a small fee.
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_model_loads_from_its_wheel_with_no_network_and_no_cache(tmp_path: Path) -> None:
    """In a fresh process with an empty home, hub downloads off and (where it can be
    made) no network at all, the model loads and embeds, and writes nothing to a cache."""
    prefix: list[str] = []
    if shutil.which("unshare") and os.geteuid() == 0:
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
        if probe.returncode == 0:
            prefix = ["unshare", "-n"]  # a network namespace with no interface up
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("AGENTLEDGER_EMBEDDINGS", None)
    code = (
        "from agentledger.retrieval._embeddings import embedder\n"
        "e = embedder()\n"
        "assert e is not None, 'no embedder'\n"
        "print(e.name, len(e.embed(['free cancellation'])[0]))\n"
    )
    done = subprocess.run(
        [*prefix, sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["wordllama:l2_supercat:256", str(256 * 4)]
    assert list(tmp_path.iterdir()) == []  # no cache, no download


async def test_hybrid_search_finds_what_the_words_miss(store: Store, tmp_path: Path) -> None:
    model = embedder()
    assert model is not None
    doc, _ = await index_path(store, write(tmp_path, "policy.md", POLICY), "acme")
    # The question shares no word with the answer: full text alone finds nothing...
    assert await store.read(retrieval_docs.search_chunks, "acme", "free cancellation", 3) == []
    # ...the vectors find it, first, with its ids to cite.
    hits = await search(store, "acme", "free cancellation", 3)
    assert hits and "call off a reservation" in hits[0].text
    assert hits[0].document_id == doc.id and hits[0].chunk_id.startswith(doc.id)
    pets = await search(store, "acme", "can I bring my dog", 1)
    assert "Pets are welcome" in pets[0].text
    # A chunk both rankings find ranks above one only the vectors find.
    both = await search(store, "acme", "breakfast morning", 3)
    assert "Breakfast is served" in both[0].text


async def test_embeddings_off_is_full_text_alone(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTLEDGER_EMBEDDINGS", "0")
    await index_path(store, write(tmp_path, "policy.md", POLICY), "acme")
    assert await search(store, "acme", "free cancellation", 3) == []
    # Indexed without vectors: turning embeddings on later embeds the same content.
    monkeypatch.delenv("AGENTLEDGER_EMBEDDINGS")
    assert await search(store, "acme", "free cancellation", 3) == []
    _, changed = await index_path(store, write(tmp_path, "policy.md", POLICY), "acme")
    assert changed
    assert await search(store, "acme", "free cancellation", 3)
    _, again = await index_path(store, write(tmp_path, "policy.md", POLICY), "acme")
    assert not again  # now embedded: the same content again changes nothing


async def test_a_tenants_vectors_never_reach_another_tenants_search(
    store: Store, tmp_path: Path
) -> None:
    await index_path(store, write(tmp_path, "policy.md", POLICY), "acme")
    parking = "# Parking\n\nThe garage closes at midnight.\n"
    await index_path(store, write(tmp_path, "other.md", parking), "globex")
    for query in ("free cancellation", "can I bring my dog", "garage"):
        hits = await search(store, "globex", query, 5)
        assert {h.text for h in hits} <= {"The garage closes at midnight."}, query
        assert all(h.chunk_id.startswith("doc-") for h in hits)
    assert await search(store, "nobody", "free cancellation", 5) == []


async def test_removed_and_replaced_documents_leave_the_vector_ranking(
    store: Store, tmp_path: Path
) -> None:
    path = write(tmp_path, "policy.md", POLICY)
    doc, _ = await index_path(store, path, "acme")
    assert await search(store, "acme", "free cancellation", 3)  # the matrix is now cached
    await store.transact(retrieval_docs.remove_document, "acme", doc.id, "test")
    assert await search(store, "acme", "free cancellation", 3) == []
    assert await search(store, "acme", "can I bring my dog", 3) == []
    # A new document is in the next search's vectors (no word of the question in it).
    pets = "# Animals\n\nPets are welcome in every room.\n"
    await index_path(store, write(tmp_path, "pets.md", pets), "acme")
    assert await store.read(retrieval_docs.search_chunks, "acme", "can I bring my dog", 3) == []
    hits = await search(store, "acme", "can I bring my dog", 3)
    assert [h.text for h in hits] == ["Pets are welcome in every room."]
