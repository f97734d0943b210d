"""Counting side effects per key: what reached a provider and took effect.

Two sources: the chaos proxy (every write it forwarded that the provider answered 2xx and
did not mark as a replay) and the tools' own hook (:func:`agentledger.testing.chaos_effect`,
one line per effect in a file the workers append to).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Effect:
    """One side effect that took place at a provider."""

    provider: str  # the proxy's NAME, or the hook's provider argument
    key: str | None  # the idempotency key that named the request; None: it carried none
    at: float  # wall clock: when the request reached the proxy, or the hook was called
    source: str  # "proxy" or "hook"
    detail: str = ""  # e.g. "POST /charges -> 200"


class BadEffectsFile(ValueError):
    """A line of the hook's file is not a record the hook writes."""


def read_hook_effects(path: Path) -> list[Effect]:
    """The effects the tools recorded with ``chaos_effect`` (none if the file is absent).

    A line cut short by a worker killed mid-write is the only bad line the hook can leave,
    and only as the file's last: it is skipped; any other bad line is an error.
    """
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    found: list[Effect] = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            found.append(
                Effect(str(record["provider"]), str(record["key"]), float(record["at"]), "hook")
            )
        except (ValueError, KeyError, TypeError) as exc:
            if n == len(lines):
                break
            raise BadEffectsFile(f"{path} line {n}: {exc}") from None
    return found


def by_key(effects: Iterable[Effect]) -> dict[tuple[str, str], list[Effect]]:
    """Effects grouped by (provider, key), in time order; key-less effects left out."""
    groups: dict[tuple[str, str], list[Effect]] = defaultdict(list)
    for effect in sorted(effects, key=lambda e: e.at):
        if effect.key is not None:
            groups[(effect.provider, effect.key)].append(effect)
    return dict(groups)
