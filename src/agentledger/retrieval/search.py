"""Searching a tenant's documents: full text, and hybrid when embeddings are present.

Without the embeddings extra (or with no embedded document) this is the store's
full-text search. With it, two rankings of the tenant's chunks are fused by reciprocal
rank fusion (each chunk scores the sum of ``1 / (RRF_K + rank)`` over the rankings it is
in): the full-text ranking (SQLite FTS5 bm25, PostgreSQL ts_rank) and the cosine
similarity of the query's vector to each chunk's. RRF needs no tuning between scores of
different scales, and a chunk found by both ranks first.

The vectors are compared in process: the tenant's matrix is read from the store once
and kept (:data:`CACHE_TENANTS` tenants at most) until its documents change (a stamp
read with the full-text search in the same store call), so a search costs one store
call, one matrix product and, for chunks only the vectors found, one read by id.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from agentledger.retrieval.embeddings import Embedder, embedder
from agentledger.store.base import Store
from agentledger.store.queries import retrieval_docs
from agentledger.store.queries.retrieval_docs import ChunkHit

RRF_K = 60
#: Candidates taken from each ranking before fusing.
POOL = 50
CACHE_TENANTS = 8

_matrices: OrderedDict[tuple[str, str, str], tuple[str, list[str], Any]] = OrderedDict()


async def search(store: Store, tenant_id: str, query: str, k: int) -> list[ChunkHit]:
    """The ``k`` best chunks of the tenant's documents for ``query``."""
    model = embedder()
    if model is None:
        return await store.search_chunks(tenant_id, query, k)
    return await hybrid_search(store, model, tenant_id, query, k)


async def hybrid_search(
    store: Store, model: Embedder, tenant_id: str, query: str, k: int
) -> list[ChunkHit]:
    """Full text and cosine similarity, fused by reciprocal rank."""
    if k <= 0:
        return []
    pool = max(POOL, 2 * k)

    def read(d: Any, conn: Any) -> tuple[list[ChunkHit], str | None]:
        hits = retrieval_docs.search_chunks(d, conn, tenant_id, query, pool)
        return hits, retrieval_docs.embedding_stamp(d, conn, tenant_id, model.name)

    text_hits, stamp = await store.transact(read, write=False)
    if stamp is None:  # nothing embedded by this model: full text alone
        return text_hits[:k]
    ids, matrix = await _matrix(store, model.name, tenant_id, stamp)
    nearest = _nearest(matrix, model.embed([query])[0], pool)
    fused: dict[str, float] = {}
    for rank, hit in enumerate(text_hits):
        fused[hit.chunk_id] = fused.get(hit.chunk_id, 0.0) + 1.0 / (RRF_K + rank + 1)
    for rank, row in enumerate(nearest):
        fused[ids[row]] = fused.get(ids[row], 0.0) + 1.0 / (RRF_K + rank + 1)
    best = sorted(fused, key=lambda cid: -fused[cid])[:k]
    known = {h.chunk_id: h for h in text_hits}
    missing = [cid for cid in best if cid not in known]
    if missing:
        found = await store.transact(
            lambda d, c: retrieval_docs.chunks_by_id(d, c, tenant_id, missing), write=False
        )
        known.update((h.chunk_id, h) for h in found)
    out = []
    for cid in best:
        found_hit = known.get(cid)
        if found_hit is not None:  # removed between the two reads: left out
            found_hit.score = fused[cid]
            out.append(found_hit)
    return out


def _nearest(matrix: Any, vector: bytes, n: int) -> list[int]:
    """Rows of ``matrix`` most similar to ``vector`` (unit vectors: dot = cosine)."""
    import numpy as np

    scores = matrix @ np.frombuffer(vector, dtype="<f4")
    n = min(n, len(scores))
    if n == 0:
        return []
    top = np.argpartition(-scores, n - 1)[:n]
    return [int(i) for i in top[np.argsort(-scores[top], kind="stable")]]


async def _matrix(store: Store, name: str, tenant_id: str, stamp: str) -> tuple[list[str], Any]:
    """The tenant's chunk ids and vectors (one row each), from the cache while current."""
    import numpy as np

    key = (str(getattr(store, "url", id(store))), name, tenant_id)
    cached = _matrices.get(key)
    if cached is not None and cached[0] == stamp:
        _matrices.move_to_end(key)
        return cached[1], cached[2]
    rows = await store.transact(
        lambda d, c: retrieval_docs.embedded_chunks(d, c, tenant_id, name), write=False
    )
    ids = [cid for cid, _ in rows]
    width = len(rows[0][1]) // 4 if rows else 0
    matrix = np.frombuffer(b"".join(v for _, v in rows), dtype="<f4").reshape(len(rows), width)
    _matrices[key] = (stamp, ids, matrix)
    _matrices.move_to_end(key)
    while len(_matrices) > CACHE_TENANTS:
        _matrices.popitem(last=False)
    return ids, matrix
