"""Documents for retrieval: their chunks and the full-text search over them.

SQLite keeps an external-content FTS5 index (``doc_chunks_fts``) that these functions
write in the same transaction as ``doc_chunks`` (there are no triggers: the migration
runner splits scripts on semicolons). PostgreSQL derives a ``tsvector`` column and
searches it through a GIN index. Every search names its tenant.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from agentledger.store.dialect import Dialect
from agentledger.store.queries.common import new_id
from agentledger.store.queries.events import insert_tenant_event

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
    d: Dialect,
    conn: Any,
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
    found = d.fetchall(
        conn,
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
        _delete_document(d, conn, found[0]["id"])
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
    d.execute(
        conn,
        f"INSERT INTO documents ({DOC_COLUMNS}, embedder) VALUES (:id, :tenant_id, :source, "
        ":title, :kind, :sha256, :chunks, :chars, :created_at, :embedder)",
        {**doc.__dict__, "embedder": embedder},
    )
    for no, chunk in enumerate(chunks):
        d.execute(
            conn,
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
    if d.name == "sqlite":
        d.execute(
            conn,
            "INSERT INTO doc_chunks_fts (rowid, heading, text) "
            "SELECT seq, heading, text FROM doc_chunks WHERE document_id = :doc",
            {"doc": doc.id},
        )
    insert_tenant_event(
        d,
        conn,
        tenant_id,
        docs_audit_id(tenant_id),
        "docs.replaced" if found else "docs.added",
        actor,
        {"document_id": doc.id, "source": source, "chunks": len(chunks)},
    )
    return doc, True


def _delete_document(d: Dialect, conn: Any, document_id: str) -> None:
    params = {"doc": document_id}
    if d.name == "sqlite":
        # An external-content FTS5 index forgets a row when told its old values.
        d.execute(
            conn,
            "INSERT INTO doc_chunks_fts (doc_chunks_fts, rowid, heading, text) "
            "SELECT 'delete', seq, heading, text FROM doc_chunks WHERE document_id = :doc",
            params,
        )
    d.execute(conn, "DELETE FROM doc_chunks WHERE document_id = :doc", params)
    d.execute(conn, "DELETE FROM documents WHERE id = :doc", params)


def list_documents(d: Dialect, conn: Any, tenant_id: str | None) -> list[Document]:
    """Documents of one tenant, or of all (``tenant_id`` None: operators)."""
    sql = f"SELECT {DOC_COLUMNS} FROM documents"
    if tenant_id is not None:
        sql += " WHERE tenant_id = :tenant"
    found = d.fetchall(conn, sql + " ORDER BY tenant_id, source", {"tenant": tenant_id})
    return [_document(r) for r in found]


def remove_document(d: Dialect, conn: Any, tenant_id: str, ref: str, actor: str) -> int:
    """Remove a tenant's document by id or by source; returns documents removed."""
    found = d.fetchall(
        conn,
        "SELECT id, source FROM documents WHERE tenant_id = :tenant "
        "AND (id = :ref OR source = :ref)",
        {"tenant": tenant_id, "ref": ref},
    )
    for row in found:
        _delete_document(d, conn, row["id"])
        insert_tenant_event(
            d,
            conn,
            tenant_id,
            docs_audit_id(tenant_id),
            "docs.removed",
            actor,
            {"document_id": row["id"], "source": row["source"]},
        )
    return len(found)


def search_chunks(d: Dialect, conn: Any, tenant_id: str, query: str, k: int) -> list[ChunkHit]:
    """The ``k`` chunks of the tenant's documents that best match ``query``.

    Chunks holding every word of the query (stemmed) come first; when they are fewer
    than ``k``, chunks holding any word follow. Within each group rarer words and more
    of them rank higher (SQLite: bm25; PostgreSQL: ts_rank). Asking for every word
    first is also what keeps a search fast: a question's common words alone would match
    most chunks, and each match must be ranked. No words: no hits.
    """
    terms = query_terms(query)
    if not terms or k <= 0:
        return []
    hits = _search(d, conn, tenant_id, terms, k, every=True)
    if len(hits) < k and len(terms) > 1:
        seen = {h.chunk_id for h in hits}
        more = _search(d, conn, tenant_id, terms, k + len(hits), every=False)
        hits += [h for h in more if h.chunk_id not in seen][: k - len(hits)]
    return hits


def _search(
    d: Dialect, conn: Any, tenant_id: str, terms: list[str], k: int, every: bool
) -> list[ChunkHit]:
    params: dict[str, Any] = {"tenant": tenant_id, "k": k}
    columns = "c.id AS chunk_id, c.document_id, doc.source, doc.title, c.heading, c.text"
    if d.name == "sqlite":
        quoted = ['"' + t.replace('"', "") + '"' for t in terms]
        params["q"] = (" AND " if every else " OR ").join(quoted)
        # bm25 is lower for better matches; the heading column weighs more.
        sql = (
            f"SELECT {columns}, -bm25(doc_chunks_fts, 2.0, 1.0) AS score "
            "FROM doc_chunks_fts JOIN doc_chunks c ON c.seq = doc_chunks_fts.rowid "
            "JOIN documents doc ON doc.id = c.document_id "
            "WHERE doc_chunks_fts MATCH :q AND c.tenant_id = :tenant "
            "ORDER BY score DESC, c.seq LIMIT :k"
        )
    else:
        # websearch_to_tsquery never fails on user text; words are ANDed, " or " ORs them.
        params["q"] = (" " if every else " or ").join(terms)
        sql = (
            f"SELECT {columns}, ts_rank(c.tsv, query) AS score "
            "FROM doc_chunks c JOIN documents doc ON doc.id = c.document_id, "
            "websearch_to_tsquery('english', :q) query "
            "WHERE c.tenant_id = :tenant AND c.tsv @@ query "
            "ORDER BY score DESC, c.seq LIMIT :k"
        )
    return [_hit(r) for r in d.fetchall(conn, sql, params)]


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


# embeddings (optional: retrieval/search.py) ----------------------------------------


def embedding_stamp(d: Dialect, conn: Any, tenant_id: str, embedder: str) -> str | None:
    """What changes whenever the tenant's vectors of ``embedder`` change (a cache key);
    None when the tenant has no document embedded by it."""
    rows = d.fetchall(
        conn,
        "SELECT COUNT(*) AS n, MAX(created_at) AS latest, SUM(chunks) AS chunks "
        "FROM documents WHERE tenant_id = :tenant AND embedder = :embedder",
        {"tenant": tenant_id, "embedder": embedder},
    )
    row = rows[0]
    if not row["n"]:
        return None
    return f"{row['n']}:{row['latest']!r}:{row['chunks']}"


def embedded_chunks(
    d: Dialect, conn: Any, tenant_id: str, embedder: str
) -> list[tuple[str, bytes]]:
    """(chunk id, vector bytes) of every chunk of the tenant embedded by ``embedder``."""
    rows = d.fetchall(
        conn,
        "SELECT c.id, c.embedding FROM doc_chunks c JOIN documents doc ON doc.id = c.document_id "
        "WHERE doc.tenant_id = :tenant AND doc.embedder = :embedder "
        "AND c.embedding IS NOT NULL ORDER BY c.seq",
        {"tenant": tenant_id, "embedder": embedder},
    )
    return [(r["id"], bytes(r["embedding"])) for r in rows]


def chunks_by_id(d: Dialect, conn: Any, tenant_id: str, ids: list[str]) -> list[ChunkHit]:
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
    return [_hit(r) for r in d.fetchall(conn, sql, params)]
