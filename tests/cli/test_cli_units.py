"""Fast checks of the CLI's pure pieces: version routing and literal text."""

from __future__ import annotations

import pytest
from rich.console import Console

from agentledger.cli._routing import choose_version, version_key
from agentledger.cli._text import cell, markup_safe, visible
from agentledger.errors import UnknownTargetError, UsageError

KNOWN = {"w@1": "workflow", "w@2": "workflow", "w@9": "workflow", "w@10": "workflow"}


def test_versions_compare_numerically() -> None:
    assert max(["9", "10", "2"], key=version_key) == "10"
    assert max(["1.9", "1.10"], key=version_key) == "1.10"


def test_the_newest_live_version_wins_not_the_newest_registered() -> None:
    assert choose_version("w", None, KNOWN, {"9", "1"}, "here") == ("9", "workflow", True)
    assert choose_version("w", None, KNOWN, {"9", "10"}, "here")[0] == "10"


def test_no_live_version_is_refused_with_how_to_proceed() -> None:
    with pytest.raises(UsageError, match=r"no live worker runs w .*--version"):
        choose_version("w", None, KNOWN, set(), "here")


def test_an_explicit_version_is_queued_even_without_a_worker() -> None:
    assert choose_version("w", "2", KNOWN, set(), "here") == ("2", "workflow", False)
    with pytest.raises(UnknownTargetError, match="w@3"):
        choose_version("w", "3", KNOWN, set(), "here")
    with pytest.raises(UnknownTargetError, match="unknown agent or workflow 'x'"):
        choose_version("x", None, {}, set(), "here")


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[8mhidden\x1b[0m", "\\x1b[8mhidden\\x1b[0m"),
        ("a\nb\tc\x00", "a\\x0ab\\x09c\\x00"),
        ("pay\u202eevil", "pay\\u202eevil"),
        ("bad\udcff", "bad\\udcff"),
        ("[/bold] fine", "[/bold] fine"),
    ],
)
def test_control_characters_are_spelled_out(raw: str, shown: str) -> None:
    assert visible(raw) == shown


def _render(renderable: object) -> str:
    out = Console(width=200, record=True, color_system=None)
    with out.capture() as captured:
        out.print(renderable)
    return captured.get()


def test_markup_in_untrusted_text_is_printed_not_interpreted() -> None:
    assert _render(cell("[/bold] :smile: [red]x")).strip() == "[/bold] :smile: [red]x"
    assert _render(markup_safe("[/bold]") + " ok").strip() == "[/bold] ok"
