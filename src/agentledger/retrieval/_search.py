"""Searching a tenant's documents: full text, and hybrid when embeddings are present.

Without the embeddings extra (or with no embedded document) this is the store's
full-text search. With it, two rankings of the tenant's chunks are fused by reciprocal
rank fusion (each chunk scores the sum of ``1 / (RRF_K + rank)`` over the rankings it is
in): the full-text ranking (SQLite: BM25 with the tenant's own statistics; PostgreSQL:
ts_rank) and the cosine similarity of the query's vector to each chunk's, both over the
tenant's chunks alone, so no score or order depends on another tenant's documents. RRF
needs no tuning between scores of different scales, and a chunk found by both ranks
first.

The vectors are compared in process: the tenant's matrix is read from the store once
and kept (:data:`CACHE_TENANTS` tenants at most) until its documents change. A search
embeds the query, ranks the cached vectors (one matrix product), then makes one store
call that checks the cache is current (a stamp of the tenant's embedded documents),
runs the full-text search, fuses, and reads the chunks only the vectors found.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from agentledger.retrieval import _queries as retrieval_docs
from agentledger.retrieval._embeddings import Embedder, embedder
from agentledger.retrieval._queries import ChunkHit
from agentledger.store._sqlstore import Store
from agentledger.store._tx import Tx

RRF_K = 60
#: A chunk the vectors alone find must be about the query: cosine similarity at least
#: MIN_COSINE and at least RELATIVE_COSINE of the best chunk's (else every search would
#: list ``k`` chunks, related or not). Both judge the query against the tenant's own
#: chunks only.
MIN_COSINE = 0.2
RELATIVE_COSINE = 0.5
#: Candidates taken from the vector ranking before fusing (the full-text ranking gives
#: its usual ``k``, so its cost is that of a full-text search).
POOL = 50
CACHE_TENANTS = 8

_matrices: OrderedDict[tuple[str, str, str], tuple[str, list[str], Any]] = OrderedDict()


async def search(store: Store, tenant_id: str, query: str, k: int) -> list[ChunkHit]:
    """The ``k`` best chunks of the tenant's documents for ``query``."""
    model = embedder()
    if model is None:
        return await store.read(retrieval_docs.search_chunks, tenant_id, query, k)
    return await hybrid_search(store, model, tenant_id, query, k)


async def hybrid_search(
    store: Store, model: Embedder, tenant_id: str, query: str, k: int
) -> list[ChunkHit]:
    """Full text and cosine similarity, fused by reciprocal rank: one store call while
    the tenant's vectors are cached and current, two when they must be (re)read."""
    if k <= 0:
        return []
    vector = model.embed([query])[0]
    key = (str(getattr(store, "url", id(store))), model.name, tenant_id)
    for _ in range(3):  # documents changing between reads: read the vectors again
        cached = _matrices.get(key)
        if cached is not None:
            _matrices.move_to_end(key)
        nearest = [] if cached is None else [cached[1][i] for i in _nearest(cached[2], vector)]
        stamp_seen = None if cached is None else cached[0]

        def read(tx: Tx) -> tuple[str | None, list[ChunkHit] | None]:
            stamp = retrieval_docs.embedding_stamp(tx, tenant_id, model.name)
            if stamp is not None and stamp != stamp_seen:
                return stamp, None  # the cached vectors are not the tenant's current ones
            # The full-text ranking of exactly what full text alone would return.
            hits = retrieval_docs.search_chunks(tx, tenant_id, query, k)
            if stamp is None:  # nothing embedded by this model: full text alone
                return stamp, hits
            return stamp, _fuse(tx, tenant_id, hits, nearest, k)

        stamp, hits = await store.read(read)
        if hits is not None:
            return hits
        assert stamp is not None
        await _load(store, key, stamp)
    raise RuntimeError("the tenant's documents kept changing during the search; try again")


def _fuse(
    tx: Tx, tenant_id: str, text_hits: list[ChunkHit], nearest: list[str], k: int
) -> list[ChunkHit]:
    fused: dict[str, float] = {}
    for ranking in ([h.chunk_id for h in text_hits], nearest):
        for rank, chunk_id in enumerate(ranking):
            fused[chunk_id] = fused.get(chunk_id, 0.0) + 1.0 / (RRF_K + rank + 1)
    best = sorted(fused, key=lambda cid: -fused[cid])[:k]
    known = {h.chunk_id: h for h in text_hits}
    missing = [cid for cid in best if cid not in known]
    known.update((h.chunk_id, h) for h in retrieval_docs.chunks_by_id(tx, tenant_id, missing))
    out = []
    for cid in best:
        hit = known.get(cid)
        if hit is not None:
            hit.score = fused[cid]
            out.append(hit)
    return out


def _nearest(matrix: Any, vector: bytes, n: int = POOL) -> list[int]:
    """Rows of ``matrix`` most similar to ``vector`` (unit vectors: dot = cosine)."""
    import numpy as np

    if len(matrix) == 0:
        return []
    # einsum, not ``@``: a single-threaded loop, fast enough for a tenant's vectors,
    # instead of the BLAS thread pool, whose wake-ups on a busy machine cost more than
    # the product at the latency tail.
    scores = np.einsum("ij,j->i", matrix, np.frombuffer(vector, dtype="<f4"))
    n = min(n, len(scores))
    if n == 0:
        return []
    top = np.argpartition(-scores, n - 1)[:n]
    ranked = top[np.argsort(-scores[top], kind="stable")]
    floor = max(MIN_COSINE, RELATIVE_COSINE * float(scores[ranked[0]]))
    return [int(i) for i in ranked if float(scores[i]) >= floor]


async def _load(store: Store, key: tuple[str, str, str], stamp: str) -> None:
    """Read the tenant's chunk ids and vectors (one row each) into the cache."""
    import numpy as np

    _, name, tenant_id = key
    rows = await store.read(retrieval_docs.embedded_chunks, tenant_id, name)
    ids = [cid for cid, _ in rows]
    width = len(rows[0][1]) // 4 if rows else 0
    matrix = np.frombuffer(b"".join(v for _, v in rows), dtype="<f4").reshape(len(rows), width)
    _matrices[key] = (stamp, ids, matrix)
    _matrices.move_to_end(key)
    while len(_matrices) > CACHE_TENANTS:
        _matrices.popitem(last=False)
