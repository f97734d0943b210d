"""Chunking: documents cut by headings, then paragraphs, into chunks of about
``max_chars`` characters, each starting with the tail of the chunk before it in the
same section (``overlap``), so a sentence cut at a boundary is found from both sides.

Every chunk keeps the path of headings it sits under ("Cancellation policy > Refunds"):
it is indexed with the chunk (weighted higher) and shown when the chunk is cited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CHARS = 800
OVERLAP = 150
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Chunk:
    """One piece of a document: the headings above it and its text."""

    heading: str
    text: str


def chunk_markdown(text: str, max_chars: int = MAX_CHARS, overlap: int = OVERLAP) -> list[Chunk]:
    """Chunk Markdown by headings (``#`` .. ``######``, not inside code fences), then
    paragraphs."""
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []
    body: list[str] = []
    fenced = False

    def flush() -> None:
        heading = " > ".join(title for _, title in path)
        chunks.extend(_pack(heading, "\n".join(body), max_chars, overlap))
        body.clear()

    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match is None:
            body.append(line)
            continue
        flush()
        level, title = len(match.group(1)), match.group(2).strip()
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, title))
    flush()
    return chunks


def chunk_text(text: str, max_chars: int = MAX_CHARS, overlap: int = OVERLAP) -> list[Chunk]:
    """Chunk plain text by paragraphs (blank lines)."""
    return _pack("", text, max_chars, overlap)


def _paragraphs(body: str) -> list[str]:
    parts = re.split(r"\n\s*\n", body)
    return [p.strip() for p in parts if p.strip()]


def _pieces(paragraph: str, max_chars: int) -> list[str]:
    """A paragraph as pieces of at most ``max_chars``: whole sentences, else words."""
    if len(paragraph) <= max_chars:
        return [paragraph]
    pieces: list[str] = []
    current = ""
    for sentence in _SENTENCE_END.split(paragraph):
        for word in _words_within(sentence, max_chars):
            candidate = f"{current} {word}".strip()
            if len(candidate) <= max_chars:
                current = candidate
            else:
                if current:
                    pieces.append(current)
                current = word
        if current and len(current) >= max_chars * 0.6:
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces


def _words_within(sentence: str, max_chars: int) -> list[str]:
    """A sentence that fits, or its words (a word longer than a chunk is cut)."""
    if len(sentence) <= max_chars:
        return [sentence]
    words: list[str] = []
    for word in sentence.split():
        while len(word) > max_chars:
            words.append(word[:max_chars])
            word = word[max_chars:]
        words.append(word)
    return words


def _tail(text: str, overlap: int) -> str:
    """The last ``overlap`` characters of ``text``, starting at a word."""
    if overlap <= 0 or len(text) <= overlap:
        return text if overlap > 0 else ""
    cut = text[-overlap:]
    space = cut.find(" ")
    return cut[space + 1 :] if 0 <= space < len(cut) - 1 else cut


def _pack(heading: str, body: str, max_chars: int, overlap: int) -> list[Chunk]:
    pieces = [p for para in _paragraphs(body) for p in _pieces(para, max_chars)]
    chunks: list[str] = []
    current = ""
    fresh = False  # current holds text beyond the overlap carried from the chunk before
    for piece in pieces:
        candidate = f"{current}\n\n{piece}" if current else piece
        if len(candidate) <= max_chars or not fresh:
            current, fresh = candidate, True
            continue
        chunks.append(current)
        carried = _tail(current, overlap)
        current = f"{carried}\n\n{piece}" if carried else piece
    if current and fresh:
        chunks.append(current)
    return [Chunk(heading, c) for c in chunks]
