"""Reading files into chunks, and indexing them in the store (``agentledger docs add``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from agentledger.errors import UsageError
from agentledger.retrieval import _queries as retrieval_docs
from agentledger.retrieval._chunking import MAX_CHARS, OVERLAP, Chunk, chunk_markdown, chunk_text
from agentledger.retrieval._embeddings import embedder
from agentledger.retrieval._html import html_to_markdown
from agentledger.retrieval._queries import Document, NewChunk
from agentledger.store._sqlstore import Store

KINDS = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".mdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".txt": "text",
    ".text": "text",
    ".rst": "text",
}
MAX_BYTES = 20 * 1024 * 1024


@dataclass
class LoadedDocument:
    """A file read and chunked, ready to index."""

    source: str
    title: str
    kind: str
    sha256: str
    chunks: list[Chunk]


def kind_of(path: Path) -> str:
    """markdown, html or text, by the file's extension (unknown: text)."""
    return KINDS.get(path.suffix.lower(), "text")


def load_document(
    path: Path,
    *,
    source: str | None = None,
    max_chars: int = MAX_CHARS,
    overlap: int = OVERLAP,
) -> LoadedDocument:
    """Read ``path`` (UTF-8) and chunk it by its kind; ``source`` names it (default: the
    absolute path). Raises :class:`UsageError` for a file that is missing, too large or
    not text."""
    if not path.is_file():
        raise UsageError(f"no file at {path}")
    raw = path.read_bytes()
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{path} is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    kind = kind_of(path)
    title: str | None = None
    if kind == "html":
        text, title = html_to_markdown(text)
    if kind in ("markdown", "html"):
        chunks = chunk_markdown(text, max_chars, overlap)
        title = title or _first_heading(chunks)
    else:
        chunks = chunk_text(text, max_chars, overlap)
    return LoadedDocument(
        source=source or str(path.resolve()),
        title=title or path.name,
        kind=kind,
        sha256=hashlib.sha256(raw).hexdigest(),
        chunks=chunks,
    )


def _first_heading(chunks: list[Chunk]) -> str | None:
    for chunk in chunks:
        if chunk.heading:
            return chunk.heading.split(" > ")[0]
    return None


async def index_path(
    store: Store,
    path: Path,
    tenant_id: str = "default",
    *,
    source: str | None = None,
    actor: str = "cli",
) -> tuple[Document, bool]:
    """Chunk ``path`` and index it for ``tenant_id``: (document, changed). Adding the
    same content again changes nothing; new content under the same source replaces it."""
    doc = load_document(path, source=source)
    return await store.transact(
        retrieval_docs.add_document,
        tenant_id,
        doc.source,
        doc.title,
        doc.kind,
        doc.sha256,
        new_chunks(doc.chunks),
        actor,
    )


def new_chunks(chunks: list[Chunk]) -> list[NewChunk]:
    """Chunks to index, embedded when the embeddings extra is installed (the heading
    path goes into the vector too: it often names what the chunk is about)."""
    model = embedder()
    if model is None:
        return [NewChunk(c.heading, c.text) for c in chunks]
    vectors = model.embed([f"{c.heading}\n{c.text}" if c.heading else c.text for c in chunks])
    return [
        NewChunk(c.heading, c.text, vector, model.name)
        for c, vector in zip(chunks, vectors, strict=True)
    ]
