"""Retrieval: documents (Markdown, text, HTML) chunked and indexed in the store, found
by full-text search (SQLite FTS5, PostgreSQL tsvector + GIN), exposed to agents as the
read tool :data:`search_docs` whose results carry document and chunk ids to cite.

With the embeddings extra (``pip install 'agentledger[embeddings]'``: a small model whose
weights ship inside its wheel and load offline) chunks are also embedded, and searches
fuse full text with cosine similarity (:mod:`agentledger.retrieval._search`).
"""

from agentledger.retrieval._chunking import Chunk, chunk_markdown, chunk_text
from agentledger.retrieval._html import html_to_markdown
from agentledger.retrieval._ingest import LoadedDocument, index_path, load_document
from agentledger.retrieval._queries import Document
from agentledger.retrieval._search import search
from agentledger.retrieval._tools import search_docs

__all__ = [
    "Chunk",
    "Document",
    "LoadedDocument",
    "chunk_markdown",
    "chunk_text",
    "html_to_markdown",
    "index_path",
    "load_document",
    "search",
    "search_docs",
]
