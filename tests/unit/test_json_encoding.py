"""The two JSON encodings every journal value goes through -- the JSON columns'
(``records.dumps``) and the canonical one (hashes, audit records) -- give exactly what
``json.dumps`` with the same settings gives, call after call, failures included."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentledger import records
from agentledger._canonical import exact_json, one_shot

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _columns(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _canonical(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _texts(value: Any) -> list[str]:
    """Every string of ``value``, dictionary keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (k, *_texts(v))]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def _stored(value: Any) -> Any:
    """``value`` as the JSON columns keep it: a NUL (which PostgreSQL's text refuses)
    becomes U+FFFD, in keys and values alike."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_stored(k): _stored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stored(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(_json)
def test_both_encodings_are_json_dumps(value: Any) -> None:
    assert exact_json(value) == _canonical(value)
    text = records.dumps(value)
    assert json.loads(text) == _stored(json.loads(_columns(value)))
    surrogate = any("\ud800" <= c <= "\udfff" for t in _texts(value) for c in t)
    if not surrogate and not any("\x00" in t for t in _texts(value)):
        assert text == _columns(value)


def test_a_text_that_spells_an_escape_is_kept_as_written() -> None:
    # The six characters of an escape in the text are text, not a NUL to replace.
    for value in ("\\u0000", {"\\u0000\x00": 1}, ["a\\u0000b"]):
        assert json.loads(records.dumps(value)) == _stored(value)


def test_the_edges_are_json_dumps_edges() -> None:
    # Not JSON types: the columns' encoding writes them as text, as default=str does.
    for value in ({"when": {1, 2}}, {"t": (1, "a")}, {"big": 10**30}, -0.0, "é\u2028"):
        assert records.dumps(value) == _columns(value)
    assert records.dumps(math.nan) == "NaN"  # the columns' encoder allows it, as before
    with pytest.raises(ValueError):
        exact_json({"x": math.inf})  # the canonical one never does
    with pytest.raises(TypeError):
        exact_json({1: "a", "b": 2})  # keys that cannot be sorted
    # A failure half way leaves nothing behind for the next call.
    assert exact_json({"a": [1, {"b": 2}]}) == '{"a":[1,{"b":2}]}'


def test_a_cycle_fails_and_the_next_value_encodes() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(RecursionError):
        records.dumps({"c": cycle})
    assert records.dumps({"c": [1]}) == '{"c":[1]}'


def test_an_encoder_that_checks_cycles_is_refused() -> None:
    with pytest.raises(ValueError, match="check_circular"):
        one_shot(json.JSONEncoder())
