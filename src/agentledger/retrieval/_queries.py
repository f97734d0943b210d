"""Documents for retrieval: their chunks and the full-text search over them.

SQLite keeps an external-content FTS5 index (``doc_chunks_fts``) that these functions
write in the same transaction as ``doc_chunks`` (there are no triggers: the migration
runner splits scripts on semicolons). PostgreSQL derives a ``tsvector`` column and
searches it through a GIN index. Every search names its tenant.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from agentledger.store._queries.common import in_list, new_id
from agentledger.store._queries.events import insert_tenant_event
from agentledger.store._tx import Tx

DOC_COLUMNS = "id, tenant_id, source, title, kind, sha256, chunks, chars, created_at"

# Words too common to rank by: both backends drop them from a query, so they rank alike
# (PostgreSQL's 'english' configuration drops them on its own; SQLite's FTS5 does not).
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "can",
        "could",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "so",
        "that",
        "the",
        "their",
        "there",
        "this",
        "to",
        "was",
        "we",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass
class Document:
    """An indexed document."""

    id: str
    tenant_id: str
    source: str
    title: str
    kind: str
    sha256: str
    chunks: int
    chars: int
    created_at: float


@dataclass
class NewChunk:
    """A chunk to index: the heading path it sits under, and its text; optionally its
    embedding (unit float32 bytes) and the name of the model that made it."""

    heading: str
    text: str
    embedding: bytes | None = None
    embedder: str | None = None


@dataclass
class ChunkHit:
    """A chunk found by a search, with what a model needs to cite it."""

    chunk_id: str
    document_id: str
    source: str
    title: str
    heading: str
    text: str
    score: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "document_id": self.document_id,
            "title": self.title,
            "source": self.source,
            "heading": self.heading,
            "text": self.text,
            "score": round(self.score, 6),
        }


def docs_audit_id(tenant_id: str) -> str:
    """The events' ``run_id`` under which a tenant's document changes are audited."""
    return f"docs/{tenant_id}"


def _document(row: dict[str, Any]) -> Document:
    return Document(**{k: row[k] for k in DOC_COLUMNS.split(", ")})


def query_terms(text: str, limit: int = 32) -> list[str]:
    """The words of a query worth searching for: lower case, no stop words, no repeats."""
    seen: list[str] = []
    for word in _WORD.findall(text.lower()):
        if word not in STOP_WORDS and word not in seen:
            seen.append(word)
    return seen[:limit]


def add_document(
    tx: Tx,
    tenant_id: str,
    source: str,
    title: str,
    kind: str,
    sha256: str,
    chunks: list[NewChunk],
    actor: str,
) -> tuple[Document, bool]:
    """Index a document (replacing the tenant's document of the same source).

    Returns (document, changed). The same content again changes nothing: a retried
    ``docs add`` leaves one document.
    """
    params = {"tenant": tenant_id, "source": source}
    found = tx.fetchall(
        f"SELECT {DOC_COLUMNS}, embedder FROM documents "
        "WHERE tenant_id = :tenant AND source = :source",
        params,
    )
    embedded = all(c.embedding is not None for c in chunks)
    embedder = chunks[0].embedder if chunks and embedded else None
    # The same content is left alone, unless it can now be embedded (or by another model).
    if found and found[0]["sha256"] == sha256 and embedder in (None, found[0]["embedder"]):
        return _document(found[0]), False
    if found:
        _delete_document(tx, found[0]["id"])
    doc = Document(
        id=new_id("doc-"),
        tenant_id=tenant_id,
        source=source,
        title=title,
        kind=kind,
        sha256=sha256,
        chunks=len(chunks),
        chars=sum(len(c.text) for c in chunks),
        created_at=time.time(),
    )
    tx.execute(
        f"INSERT INTO documents ({DOC_COLUMNS}, embedder) VALUES (:id, :tenant_id, :source, "
        ":title, :kind, :sha256, :chunks, :chars, :created_at, :embedder)",
        {**doc.__dict__, "embedder": embedder},
    )
    for no, chunk in enumerate(chunks):
        tx.execute(
            "INSERT INTO doc_chunks (id, document_id, tenant_id, chunk_no, heading, text, "
            "embedding) VALUES (:id, :doc, :tenant, :no, :heading, :text, :embedding)",
            {
                "id": f"{doc.id}#{no}",
                "doc": doc.id,
                "tenant": tenant_id,
                "no": no,
                "heading": chunk.heading,
                "text": chunk.text,
                "embedding": chunk.embedding if embedder else None,
            },
        )
    if tx.dialect.name == "sqlite":
        tx.execute(
            "INSERT INTO doc_chunks_fts (rowid, heading, text) "
            "SELECT seq, heading, text FROM doc_chunks WHERE document_id = :doc",
            {"doc": doc.id},
        )
    insert_tenant_event(
        tx,
        tenant_id,
        docs_audit_id(tenant_id),
        "docs.replaced" if found else "docs.added",
        actor,
        {"document_id": doc.id, "source": source, "chunks": len(chunks)},
    )
    return doc, True


def _delete_document(tx: Tx, document_id: str) -> None:
    params = {"doc": document_id}
    if tx.dialect.name == "sqlite":
        # An external-content FTS5 index forgets a row when told its old values.
        tx.execute(
            "INSERT INTO doc_chunks_fts (doc_chunks_fts, rowid, heading, text) "
            "SELECT 'delete', seq, heading, text FROM doc_chunks WHERE document_id = :doc",
            params,
        )
    tx.execute("DELETE FROM doc_chunks WHERE document_id = :doc", params)
    tx.execute("DELETE FROM documents WHERE id = :doc", params)


def list_documents(tx: Tx, tenant_id: str | None = None) -> list[Document]:
    """Documents of one tenant, or of all (``tenant_id`` None: operators)."""
    sql = f"SELECT {DOC_COLUMNS} FROM documents"
    if tenant_id is not None:
        sql += " WHERE tenant_id = :tenant"
    found = tx.fetchall(sql + " ORDER BY tenant_id, source", {"tenant": tenant_id})
    return [_document(r) for r in found]


def remove_document(tx: Tx, tenant_id: str, ref: str, actor: str) -> int:
    """Remove a tenant's document by id or by source; returns documents removed."""
    found = tx.fetchall(
        "SELECT id, source FROM documents WHERE tenant_id = :tenant "
        "AND (id = :ref OR source = :ref)",
        {"tenant": tenant_id, "ref": ref},
    )
    for row in found:
        _delete_document(tx, row["id"])
        insert_tenant_event(
            tx,
            tenant_id,
            docs_audit_id(tenant_id),
            "docs.removed",
            actor,
            {"document_id": row["id"], "source": row["source"]},
        )
    return len(found)


def search_chunks(tx: Tx, tenant_id: str, query: str, k: int = 5) -> list[ChunkHit]:
    """The ``k`` chunks of the tenant's documents that best match ``query``.

    Chunks holding every word of the query (stemmed) come first; when they are fewer
    than ``k``, chunks holding any word follow. Within each group more of the words,
    and words in the heading, rank higher (SQLite: BM25 over the tenant's own chunks;
    PostgreSQL: ts_rank). Every number and every order depends on the tenant's chunks
    alone: a score computed over all tenants' chunks (FTS5's bm25() counts every
    tenant's chunks in its word statistics) would let one tenant learn what another's
    documents hold from how its own scores move. No words: no hits.
    """
    terms = query_terms(query)
    if not terms or k <= 0:
        return []
    if tx.dialect.name == "sqlite":
        return _sqlite_search(tx, tenant_id, terms, k)
    hits = _search(tx, tenant_id, terms, k, every=True)
    if len(hits) < k and len(terms) > 1:
        seen = {h.chunk_id for h in hits}
        more = _search(tx, tenant_id, terms, k + len(hits), every=False)
        hits += [h for h in more if h.chunk_id not in seen][: k - len(hits)]
    return hits


#: BM25's term-saturation and length-normalization constants (FTS5's defaults), and how
#: much more a word in a chunk's heading counts than one in its text.
BM25_K1 = 1.2
BM25_B = 0.75
HEADING_WEIGHT = 2.0

_COLUMNS = "c.id AS chunk_id, c.document_id, doc.source, doc.title, c.heading, c.text"


def _sqlite_search(tx: Tx, tenant_id: str, terms: list[str], k: int) -> list[ChunkHit]:
    """BM25 with the tenant's statistics: FTS5 finds which of the tenant's chunks hold
    each word (in the heading, in the text); the number of the tenant's chunks, their
    mean text length and each word's count among them weigh the words. A word counts
    once per column (FTS5 gives no per-word frequency to SQL)."""
    params: dict[str, Any] = {"tenant": tenant_id}
    parts = []
    for i, term in enumerate(terms):
        quoted = '"' + term.replace('"', "") + '"'
        for col in ("heading", "text"):
            params[f"q{i}{col}"] = "{" + col + "} : " + quoted
            parts.append(
                f"SELECT c.seq, {i} AS term, '{col}' AS col, length(c.text) AS chars "
                "FROM doc_chunks_fts JOIN doc_chunks c ON c.seq = doc_chunks_fts.rowid "
                f"WHERE doc_chunks_fts MATCH :q{i}{col} AND c.tenant_id = :tenant"
            )
    found = tx.fetchall(" UNION ALL ".join(parts), params)
    if not found:
        return []
    totals = tx.fetchall(
        "SELECT SUM(chunks) AS n, SUM(chars) AS chars FROM documents WHERE tenant_id = :tenant",
        params,
    )[0]
    n_chunks = max(int(totals["n"] or 0), 1)
    mean_chars = max(float(totals["chars"] or 0) / n_chunks, 1.0)
    holding: dict[int, set[int]] = {}  # word -> the tenant's chunks holding it
    cols: dict[int, dict[int, set[str]]] = {}  # chunk -> word -> columns holding it
    chars: dict[int, int] = {}
    for r in found:
        seq, word = int(r["seq"]), int(r["term"])
        holding.setdefault(word, set()).add(seq)
        cols.setdefault(seq, {}).setdefault(word, set()).add(r["col"])
        chars[seq] = int(r["chars"] or 0)
    idf = {
        t: math.log(1.0 + (n_chunks - len(s) + 0.5) / (len(s) + 0.5)) for t, s in holding.items()
    }
    scores: dict[int, float] = {}
    for seq, words in cols.items():
        norm = BM25_K1 * (1.0 - BM25_B + BM25_B * chars[seq] / mean_chars)
        text_weight = (BM25_K1 + 1.0) / (1.0 + norm)
        scores[seq] = sum(
            idf[t]
            * ((HEADING_WEIGHT if "heading" in c else 0.0) + (text_weight if "text" in c else 0.0))
            for t, c in words.items()
        )
    # Every word first, then any; better scores first; the older chunk on a tie.
    best = sorted(scores, key=lambda s: (len(cols[s]) < len(terms), -scores[s], s))[:k]
    by_seq: dict[int, dict[str, Any]] = {}
    for at in range(0, len(best), 500):  # a large ``k``: under every parameter limit
        marks, ids = in_list("s", best[at : at + 500])
        rows = tx.fetchall(
            f"SELECT c.seq, {_COLUMNS} FROM doc_chunks c JOIN documents doc "
            f"ON doc.id = c.document_id WHERE c.tenant_id = :tenant AND c.seq IN ({marks})",
            {**ids, "tenant": tenant_id},
        )
        by_seq.update((int(r["seq"]), r) for r in rows)
    return [_hit({**by_seq[s], "score": scores[s]}) for s in best if s in by_seq]


def _search(tx: Tx, tenant_id: str, terms: list[str], k: int, every: bool) -> list[ChunkHit]:
    """PostgreSQL: ts_rank scores a chunk by its own words alone (no corpus statistics)."""
    params: dict[str, Any] = {"tenant": tenant_id, "k": k}
    # websearch_to_tsquery never fails on user text; words are ANDed, " or " ORs them.
    params["q"] = (" " if every else " or ").join(terms)
    sql = (
        f"SELECT {_COLUMNS}, ts_rank(c.tsv, query) AS score "
        "FROM doc_chunks c JOIN documents doc ON doc.id = c.document_id, "
        "websearch_to_tsquery('english', :q) query "
        "WHERE c.tenant_id = :tenant AND c.tsv @@ query "
        "ORDER BY score DESC, c.seq LIMIT :k"
    )
    return [_hit(r) for r in tx.fetchall(sql, params)]


def _hit(r: dict[str, Any]) -> ChunkHit:
    return ChunkHit(
        chunk_id=r["chunk_id"],
        document_id=r["document_id"],
        source=r["source"],
        title=r["title"],
        heading=r["heading"],
        text=r["text"],
        score=float(r.get("score") or 0.0),
    )


# embeddings (optional: retrieval/_search.py) ----------------------------------------


def embedding_stamp(tx: Tx, tenant_id: str, embedder: str) -> str | None:
    """What changes whenever the tenant's vectors of ``embedder`` change (a cache key);
    None when the tenant has no document embedded by it."""
    rows = tx.fetchall(
        "SELECT COUNT(*) AS n, MAX(created_at) AS latest, SUM(chunks) AS chunks "
        "FROM documents WHERE tenant_id = :tenant AND embedder = :embedder",
        {"tenant": tenant_id, "embedder": embedder},
    )
    row = rows[0]
    if not row["n"]:
        return None
    return f"{row['n']}:{row['latest']!r}:{row['chunks']}"


def embedded_chunks(tx: Tx, tenant_id: str, embedder: str) -> list[tuple[str, bytes]]:
    """(chunk id, vector bytes) of every chunk of the tenant embedded by ``embedder``."""
    rows = tx.fetchall(
        "SELECT c.id, c.embedding FROM doc_chunks c JOIN documents doc ON doc.id = c.document_id "
        "WHERE doc.tenant_id = :tenant AND doc.embedder = :embedder "
        "AND c.embedding IS NOT NULL ORDER BY c.seq",
        {"tenant": tenant_id, "embedder": embedder},
    )
    return [(r["id"], bytes(r["embedding"])) for r in rows]


def chunks_by_id(tx: Tx, tenant_id: str, ids: list[str]) -> list[ChunkHit]:
    """The tenant's chunks of these ids (others' never, whatever the ids)."""
    if not ids:
        return []
    names = [f"id{i}" for i in range(len(ids))]
    params: dict[str, Any] = dict(zip(names, ids, strict=True))
    params["tenant"] = tenant_id
    marks = ", ".join(f":{n}" for n in names)
    sql = (
        "SELECT c.id AS chunk_id, c.document_id, doc.source, doc.title, c.heading, c.text "
        "FROM doc_chunks c JOIN documents doc ON doc.id = c.document_id "
        f"WHERE c.tenant_id = :tenant AND c.id IN ({marks})"
    )
    return [_hit(r) for r in tx.fetchall(sql, params)]
