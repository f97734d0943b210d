"""Showing untrusted text on a terminal: never as markup, never as control sequences.

Tool names, arguments, errors and events come from models and providers. Rendered
as rich markup, ``[/bold]`` crashes a command; printed raw, an escape sequence such as
``\\x1b[8m`` hides the rest of a line from the person who must approve it. Every such
value goes through :func:`cell` (a table cell) or :func:`markup_safe` (inside markup).
"""

from __future__ import annotations

import math
import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is loaded by the commands that print (a worker never does)
    from rich.console import Console
    from rich.text import Text

# C0 and C1 controls, DEL, zero-width and bidirectional formatting characters (they
# reorder or hide text), the BOM, and lone surrogates (undecodable bytes from argv).
_INVISIBLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\ud800-\udfff]"
)


def _show(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(value: Any) -> str:
    """``value`` as text in which every control or invisible character is spelled out
    (``\\x1b``, ``\\n``, ``\\u202e``)."""
    text = value if isinstance(value, str) else str(value)
    return _INVISIBLE.sub(_show, text)


def cell(value: Any) -> Text:
    """A table cell that shows ``value`` literally (no markup, no control characters)."""
    from rich.text import Text

    return Text("" if value is None else visible(value))


def markup_safe(value: Any) -> str:
    """``value`` to embed in a markup string: visible and markup-escaped."""
    from rich.markup import escape

    return escape(visible(value))


def console() -> Console:
    """The console of every command. Piped output is never wrapped (programs and people
    copy ids from it) unless COLUMNS asks for a width; no emoji codes, no highlighting."""
    from rich.console import Console

    width = None
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        width = 100_000
    return Console(width=width, emoji=False, highlight=False)


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as strings, so that the output is valid JSON
    even for rows written before NaN was refused."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
