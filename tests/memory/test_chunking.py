"""Chunking by headings and paragraphs, with overlap; HTML through html.parser."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from agentledger.errors import UsageError
from agentledger.retrieval import chunk_markdown, chunk_text, html_to_markdown, load_document


def test_markdown_chunks_follow_headings_and_keep_the_heading_path() -> None:
    text = "# Policy\n\nIntro.\n\n## Cancel\n\nFree up to 48 hours.\n\n### Late\n\nFirst night.\n"
    chunks = chunk_markdown(text)
    assert [(c.heading, c.text) for c in chunks] == [
        ("Policy", "Intro."),
        ("Policy > Cancel", "Free up to 48 hours."),
        ("Policy > Cancel > Late", "First night."),
    ]


def test_a_heading_inside_a_code_fence_is_text() -> None:
    chunks = chunk_markdown("# A\n\n```\n# not a heading\n```\n")
    assert [c.heading for c in chunks] == ["A"]
    assert "# not a heading" in chunks[0].text


def test_long_sections_are_cut_near_max_chars_with_overlap() -> None:
    sentences = [f"Sentence {n} says something about rooms." for n in range(80)]
    paragraphs = "\n\n".join(" ".join(sentences[i : i + 4]) for i in range(0, 80, 4))
    chunks = chunk_markdown("# Long\n\n" + paragraphs, max_chars=800, overlap=150)
    assert len(chunks) > 3
    assert all(len(c.text) <= 800 + 150 + 2 for c in chunks)
    for before, after in itertools.pairwise(chunks):
        # Each chunk starts with the end of the one before it.
        assert before.text[-60:].split()[-1] in after.text[:200]
    joined = " ".join(c.text for c in chunks)
    assert all(s in joined for s in sentences)  # nothing lost


def test_a_paragraph_longer_than_a_chunk_is_split_by_sentences_and_words() -> None:
    word = "x" * 2000
    chunks = chunk_text(f"{word}\n\nshort.", max_chars=800, overlap=0)
    assert all(len(c.text) <= 800 for c in chunks)
    assert "".join(c.text for c in chunks).replace("\n", "").startswith("x" * 2000)


def test_html_becomes_headings_and_paragraphs_without_scripts() -> None:
    page = (
        "<html><head><title>FAQ</title><style>p{color:red}</style></head><body>"
        "<h1>Help</h1><p>Can I cancel &amp; get a refund?</p><script>alert(1)</script>"
        "<h2>Payments</h2><ul><li>Card</li><li>Cash</li></ul></body></html>"
    )
    text, title = html_to_markdown(page)
    assert title == "FAQ"
    assert "alert" not in text and "color" not in text
    chunks = chunk_markdown(text)
    assert [c.heading for c in chunks] == ["Help", "Help > Payments"]
    assert chunks[0].text == "Can I cancel & get a refund?"
    assert "- Card" in chunks[1].text and "- Cash" in chunks[1].text


def test_load_document_by_kind(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text("<h1>Title</h1><p>Body</p>")
    (tmp_path / "b.txt").write_text("one\n\ntwo")
    html_doc = load_document(tmp_path / "a.html")
    assert (html_doc.kind, html_doc.title) == ("html", "Title")
    text_doc = load_document(tmp_path / "b.txt")
    assert (text_doc.kind, text_doc.title, len(text_doc.chunks)) == ("text", "b.txt", 1)
    (tmp_path / "c.md").write_bytes(b"\xff\xfe bad")
    with pytest.raises(UsageError, match="not UTF-8"):
        load_document(tmp_path / "c.md")
    with pytest.raises(UsageError, match="no file"):
        load_document(tmp_path / "missing.md")
