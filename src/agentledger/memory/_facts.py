"""Fact keys and fact ranking: plain functions, the same on every backend."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from agentledger.memory._queries import Fact
from agentledger.retrieval._queries import query_terms

MAX_FACT_CHARS = 1000
_SPACE = re.compile(r"\s+")


def normalize_fact(text: str) -> str:
    """A fact's text as stored: one line, trimmed, at most :data:`MAX_FACT_CHARS`."""
    return _SPACE.sub(" ", text).strip()[:MAX_FACT_CHARS]


def fact_key_of(text: str) -> str:
    """The default key of a fact: a hash of its normalized, lower-cased text.

    Opaque on purpose: the audit trail records forgotten keys, and a key must not carry
    the text that forgetting deleted.
    """
    digest = hashlib.sha256(normalize_fact(text).lower().encode()).hexdigest()
    return f"fact-{digest[:16]}"


def rank_facts(facts: Sequence[Fact], query: str, k: int) -> list[Fact]:
    """The ``k`` facts sharing the most query words (ties: the newest first).

    A query with no words worth searching returns the newest facts. A user holds few
    facts, so ranking in Python keeps both backends exactly alike.
    """
    terms = set(query_terms(query))
    if not terms:
        return list(facts)[:k]
    scored = []
    for position, fact in enumerate(facts):  # facts come newest first
        words = set(query_terms(fact.fact + " " + fact.fact_key, limit=1000))
        hits = sum(1 for t in terms if t in words or any(w.startswith(t) for w in words))
        if hits:
            scored.append((-hits, position, fact))
    scored.sort(key=lambda s: (s[0], s[1]))
    return [fact for _, _, fact in scored[:k]]
