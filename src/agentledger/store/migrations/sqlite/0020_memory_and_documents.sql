-- Version 20 (SQLite): per-user memory and documents for retrieval.
-- A fact an agent remembered about a user, scoped by tenant. ``fact_key`` names the fact
-- (given, or a hash of its text): remembering the same key again updates it in place.
-- ``source_key`` is the idempotency key of the step that wrote it (a retried step finds
-- its own write).
CREATE TABLE memory_facts (
    id         TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    fact_key   TEXT NOT NULL,
    fact       TEXT NOT NULL,
    source_run TEXT,
    source_key TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE UNIQUE INDEX memory_facts_user_key ON memory_facts (tenant_id, user_id, fact_key);
CREATE INDEX memory_facts_source ON memory_facts (source_key);

-- A document indexed for retrieval, one per (tenant, source).
CREATE TABLE documents (
    id         TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    source     TEXT NOT NULL,
    title      TEXT NOT NULL,
    kind       TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    chunks     INTEGER NOT NULL,
    chars      INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE UNIQUE INDEX documents_source ON documents (tenant_id, source);

-- Its chunks. ``seq`` is the full-text index's row id (SQLite: the FTS5 table below).
CREATE TABLE doc_chunks (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL,
    document_id TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    chunk_no    INTEGER NOT NULL,
    heading     TEXT NOT NULL,
    text        TEXT NOT NULL
);
CREATE UNIQUE INDEX doc_chunks_id ON doc_chunks (id);
CREATE INDEX doc_chunks_document ON doc_chunks (document_id, chunk_no);

-- Full text: an external-content FTS5 index over doc_chunks (porter stemming, like
-- PostgreSQL's 'english' configuration). No triggers: the store writes both tables in
-- one transaction (queries/retrieval_docs.py).
CREATE VIRTUAL TABLE doc_chunks_fts USING fts5(
    heading, text, content='doc_chunks', content_rowid='seq', tokenize='porter unicode61'
)
