"""Canonical JSON: the one encoding of everything the journal stores.

The journal is the source of truth for replay, so a value is journaled exactly as
replay will return it. :func:`journal_value` is that round trip: the first pass of a
step returns what it returns, never the live object. A value JSON cannot carry
(a set, a datetime, non-string keys, NaN, nesting deeper than :data:`MAX_DEPTH`)
is refused with :class:`NotJournalable`, a failure class the step is failed with.

Text is sanitized on the way in: a lone UTF-16 surrogate (invalid in UTF-8) and NUL
(refused by PostgreSQL) become U+FFFD, so a provider's garbled error text can never
poison a commit.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from json.encoder import (  # type: ignore[attr-defined]
    c_make_encoder,
    encode_basestring,
    encode_basestring_ascii,
)
from typing import Any

from agentledger.errors import FailureClass, ToolError

MAX_DEPTH = 200
REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
_INF = float("inf")


class NotJournalable(ToolError):
    """A value JSON cannot carry exactly (set, datetime, non-string key, NaN, too deep)."""

    error_class = FailureClass.NOT_JOURNALABLE


def clean_text(text: str) -> str:
    """``text`` with NUL and lone surrogates replaced by U+FFFD."""
    if text.isascii():  # known to the str object itself: no scan, no encode
        return text.replace("\x00", REPLACEMENT) if "\x00" in text else text
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A valid pair is one code point in a Python str, so what is left is lone.
        text = _SURROGATE.sub(REPLACEMENT, text)
    return text


# Where a value is: () for the top, else (where its container is, its key or index).
# Made into text only for an error: a path string per value checked would cost more
# than the check itself.
_Where = tuple[Any, ...]


def _path(where: _Where) -> str:
    """``where`` as text: ``$`` for the top, ``$.key[0]`` below it."""
    pieces = []
    while where:
        where, piece = where
        pieces.append(f"[{piece}]" if isinstance(piece, int) else f".{piece}")
    return "$" + "".join(reversed(pieces))


def _check(value: Any, depth: int, where: _Where) -> Any:
    if depth > MAX_DEPTH:
        raise NotJournalable(f"value nested deeper than {MAX_DEPTH} levels at {_path(where)}")
    if value is None or isinstance(value, int):  # bool is an int
        return value
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise NotJournalable(
                    f"key {k!r} at {_path(where)} is a {type(k).__name__}; JSON keys are strings"
                )
            out[clean_text(k)] = _check(v, depth + 1, (where, k))
        return out
    if isinstance(value, (list, tuple)):  # a tuple of types is checked faster than a union
        return [_check(v, depth + 1, (where, i)) for i, v in enumerate(value)]
    if isinstance(value, float):
        if value != value or value in (_INF, -_INF):
            raise NotJournalable(f"{value} at {_path(where)} is not JSON; use null or a string")
        return value
    raise NotJournalable(
        f"{type(value).__name__} at {_path(where)} is not JSON; return dicts, lists, str, int, "
        "float, bool or None (convert it first, e.g. a datetime to isoformat())"
    )


def journal_value(value: Any) -> Any:
    """``value`` exactly as the journal will give it back on replay (tuples become lists,
    text is sanitized); raise :class:`NotJournalable` for anything else."""
    return _check(value, 0, ())


def one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, with the C encoder it builds made once.

    ``JSONEncoder.encode`` makes a new C encoder from its settings on every call, which
    costs more than encoding a small value. The encoder must not check for cycles: the
    check's bookkeeping would be shared by every call (a value with a cycle then fails
    with :class:`RecursionError`).
    """
    if encoder.check_circular:
        raise ValueError("one_shot needs an encoder made with check_circular=False")
    if c_make_encoder is None:  # no C accelerator in this interpreter
        return encoder.encode
    made = c_make_encoder(
        None,
        encoder.default,
        encode_basestring_ascii if encoder.ensure_ascii else encode_basestring,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )

    def encode(value: Any) -> str:
        return "".join(made(value, 0))

    return encode


# No cycle check: what it encodes is a tree :func:`journal_value` built (a cycle is
# refused there, as too deep) or stored JSON, so the check would find none.
_CANONICAL = one_shot(
    json.JSONEncoder(
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        check_circular=False,
    )
)


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 text: equal values give equal strings, in every
    process (no ``default=str``, whose output can differ between processes)."""
    return _CANONICAL(journal_value(value))


def exact_json(value: Any) -> str:
    """The canonical encoding of ``value`` as it is, for hashes over stored values.

    The same encoder as :func:`canonical_json`, without sanitizing: text keeps its NUL
    (escaped) instead of turning into U+FFFD, so two different stored values never
    encode alike. NaN and the infinities are refused (:class:`ValueError`): JSON has no
    such numbers. ``value`` holds only JSON types (a tuple is a list)."""
    return _CANONICAL(value)


def input_hash(value: Any) -> str:
    """SHA-256 of the canonical JSON of ``value`` (hex, first 16 characters)."""
    return journaled_hash(journal_value(value))


def journaled_hash(value: Any) -> str:
    """:func:`input_hash` of a value :func:`journal_value` already returned: it is its
    own journal value, so it is encoded as it is instead of being checked again."""
    return hashlib.sha256(exact_json(value).encode()).hexdigest()[:16]


__all__ = [
    "MAX_DEPTH",
    "NotJournalable",
    "canonical_json",
    "clean_text",
    "exact_json",
    "input_hash",
    "journal_value",
    "journaled_hash",
    "one_shot",
]
