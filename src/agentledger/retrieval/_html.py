"""HTML to Markdown-ish text with the standard library's parser: headings become ``#``
lines (so HTML is chunked by its headings like Markdown), block elements end paragraphs,
scripts, styles and comments are dropped."""

from __future__ import annotations

import re
from html.parser import HTMLParser

_BLOCKS = frozenset(
    [
        "p",
        "div",
        "section",
        "article",
        "header",
        "footer",
        "main",
        "aside",
        "nav",
        "ul",
        "ol",
        "li",
        "table",
        "tr",
        "blockquote",
        "pre",
        "dl",
        "dt",
        "dd",
        "figure",
        "figcaption",
        "form",
        "fieldset",
        "address",
        "hr",
        "br",
    ]
)
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_SKIPPED = frozenset({"script", "style", "noscript", "template", "head", "svg"})


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skipping = 0
        self.title: str | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self.skipping += 1
        elif tag == "title":
            self._in_title = True
        elif tag in _HEADINGS:
            self.out.append("\n\n" + "#" * _HEADINGS[tag] + " ")
        elif tag == "li":
            self.out.append("\n- ")
        elif tag in _BLOCKS:
            self.out.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag == "title":
            self._in_title = False
        elif tag in _HEADINGS or tag in _BLOCKS:
            self.out.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title = (self.title or "") + data.strip()
            return
        if self.skipping:
            return
        self.out.append(re.sub(r"\s+", " ", data))


def html_to_markdown(text: str) -> tuple[str, str | None]:
    """(the page's text with ``#`` headings and paragraphs, its <title> if any)."""
    parser = _Text()
    parser.feed(text)
    parser.close()
    joined = "".join(parser.out)  # character references are already decoded
    lines = [ln.strip() for ln in joined.splitlines()]
    cleaned = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return cleaned, parser.title
