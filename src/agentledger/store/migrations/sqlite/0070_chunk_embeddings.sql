-- Version 70 (SQLite): optional embeddings of document chunks, for hybrid ranking.
-- ``embedding`` holds a chunk's unit vector as little-endian float32 bytes; NULL when
-- the document was indexed without an embedding model. ``documents.embedder`` names the
-- model that made its vectors: a search only compares vectors of the model it uses.
ALTER TABLE doc_chunks ADD COLUMN embedding BLOB;
ALTER TABLE documents ADD COLUMN embedder TEXT
