"""Retrieval latency: full-text search over N chunks (default 10,000) on a store.

    python -m agentledger_bench.retrieval --db sqlite:///bench-retrieval.db
    python -m agentledger_bench.retrieval --db postgresql://localhost/bench

Indexes synthetic documents (a fixed vocabulary with a Zipf-like word frequency, so some
query words are common and some rare) for one tenant, plus the same number of chunks for
a second tenant that every search must filter out, then times ``store.search_chunks``
end to end (through the store's thread and driver) and prints p50/p95/p99 in ms. The
database should be empty: the bench's tenants are removed at the end.

With the embeddings extra installed (and ``--hybrid``, the default then), the chunks are
embedded too and the same queries are also timed through the hybrid search
(:func:`agentledger.retrieval._search.hybrid_search`: full text and cosine fused by
reciprocal rank), reported as ``hybrid_p50_ms`` ... side by side with the full-text
figures of the same run. The first hybrid query reads the tenant's vectors into the
in-process cache (``hybrid_first_ms``); the percentiles are of the queries after it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import time
from typing import Any

from agentledger.retrieval import _queries as retrieval_docs
from agentledger.retrieval._embeddings import Embedder, embedder
from agentledger.retrieval._queries import NewChunk
from agentledger.retrieval._search import hybrid_search
from agentledger.store import Store, open_store
from agentledger_bench.stats import percentile

TENANT = "bench-retrieval"
OTHER = "bench-retrieval-other"
CHUNKS_PER_DOC = 50
_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "su",
    "ta",
    "ri",
    "po",
    "ve",
    "da",
    "zu",
    "fe",
    "gi",
    "ho",
    "ja",
    "ku",
]


def vocabulary(size: int, rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def chunk_text(words: list[str], cum: list[float], rng: random.Random, chars: int) -> str:
    out: list[str] = []
    length = 0
    while length < chars:
        for word in rng.choices(words, cum_weights=cum, k=32):
            out.append(word)
            length += len(word) + 1
    return " ".join(out)[:chars].rsplit(" ", 1)[0]


async def fill(
    store: Store, tenant: str, n: int, seed: int, chars: int, model: Embedder | None = None
) -> None:
    rng = random.Random(seed)
    words = vocabulary(5000, random.Random(1))  # most frequent first
    cum = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))
    for doc_no in range((n + CHUNKS_PER_DOC - 1) // CHUNKS_PER_DOC):
        count = min(CHUNKS_PER_DOC, n - doc_no * CHUNKS_PER_DOC)
        chunks = [
            NewChunk(f"Section {i}", chunk_text(words, cum, rng, chars)) for i in range(count)
        ]
        if model is not None:
            for chunk, vector in zip(chunks, model.embed([c.text for c in chunks]), strict=True):
                chunk.embedding, chunk.embedder = vector, model.name
        await store.transact(
            retrieval_docs.add_document,
            tenant,
            f"bench:{tenant}:{doc_no}",
            f"Doc {doc_no}",
            "text",
            f"{seed}-{doc_no}",
            chunks,
            "bench",
        )


async def measure(
    url: str, n: int, queries: int, k: int, chars: int, skip: int = 50, hybrid: bool = True
) -> dict[str, Any]:
    model = embedder() if hybrid else None
    store = open_store(url)
    await store.open()
    hybrid_ms: list[float] = []
    try:
        for tenant in (TENANT, OTHER):
            for doc in await store.read(retrieval_docs.list_documents, tenant):
                await store.transact(retrieval_docs.remove_document, tenant, doc.id, "bench")
        started = time.perf_counter()
        await fill(store, TENANT, n, seed=7, chars=chars, model=model)
        await fill(store, OTHER, n, seed=8, chars=chars, model=model)
        index_seconds = time.perf_counter() - started
        words = vocabulary(5000, random.Random(1))
        rng = random.Random(3)
        latencies: list[float] = []
        hits = 0
        # The vocabulary's most frequent words play the part of stop words (the query
        # parser drops those from real questions); --common-words 0 keeps them in.
        common, rest = words[skip : skip + 500], words[skip:]
        for i in range(queries + 20):
            # Two words from the common end, one or two from anywhere: like user questions.
            query = " ".join(
                [rng.choice(common) for _ in range(2)]
                + [rng.choice(rest) for _ in range(rng.randint(1, 2))]
            )
            t0 = time.perf_counter()
            found = await store.read(retrieval_docs.search_chunks, TENANT, query, k)
            elapsed = (time.perf_counter() - t0) * 1000
            if i >= 20:  # the first queries warm caches and prepared plans
                latencies.append(elapsed)
                hits += len(found)
            if model is not None:  # the same query, hybrid, right after (A/B in one run)
                t0 = time.perf_counter()
                await hybrid_search(store, model, TENANT, query, k)
                hybrid_ms.append((time.perf_counter() - t0) * 1000)
        for tenant in (TENANT, OTHER):
            for doc in await store.read(retrieval_docs.list_documents, tenant):
                await store.transact(retrieval_docs.remove_document, tenant, doc.id, "bench")
    finally:
        await store.close()
    latencies.sort()

    def pct(p: float, values: list[float] = latencies) -> float:
        return round(percentile(values, p), 3)

    extra: dict[str, Any] = {}
    if model is not None:
        first, timed = hybrid_ms[0], sorted(hybrid_ms[20:])
        extra = {
            "embedder": model.name,
            "hybrid_first_ms": round(first, 3),
            "hybrid_p50_ms": pct(0.50, timed),
            "hybrid_p95_ms": pct(0.95, timed),
            "hybrid_p99_ms": pct(0.99, timed),
        }
    return {
        "backend": url.split(":", 1)[0],
        "chunks": n,
        "other_tenant_chunks": n,
        "chunk_chars": chars,
        "queries": queries,
        "top_words_left_out_of_queries": skip,
        "k": k,
        "mean_hits": round(hits / max(1, queries), 2),
        "index_seconds": round(index_seconds, 2),
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "mean_ms": round(statistics.fmean(latencies), 3),
        **extra,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Retrieval latency at N chunks.")
    parser.add_argument("--db", required=True, help="sqlite:///file.db or postgresql://...")
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--chunk-chars", type=int, default=700)
    parser.add_argument(
        "--common-words",
        type=int,
        default=50,
        help="leave the N most frequent words out of queries (stop words) [50]",
    )
    parser.add_argument(
        "--hybrid",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time hybrid search (needs the embeddings extra) [on]",
    )
    args = parser.parse_args(argv)
    result = asyncio.run(
        measure(
            args.db,
            args.chunks,
            args.queries,
            args.k,
            args.chunk_chars,
            args.common_words,
            args.hybrid,
        )
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
