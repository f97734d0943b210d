"""Which version a plain ``submit`` runs: the newest one a live worker has.

Routing to the newest version ever registered sends runs to a version nobody runs any
more (a stopped canary) and they wait forever. A version given explicitly is queued
whatever the workers (it waits until one starts).
"""

from __future__ import annotations

import difflib
from typing import Any

from agentledger.errors import UnknownTargetError, UsageError

# A worker whose last heartbeat is older than this is not counted as live.
LIVE_WITHIN = 60.0


def version_key(version: str) -> tuple[Any, ...]:
    """Order versions numerically where they are numbers: "10" > "9", "1.10" > "1.9"."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in version.split("."))


def versions_of(name: str, targets: dict[str, str]) -> dict[str, str]:
    """version -> kind of every definition of ``name`` among ``targets``
    (``name@version`` -> kind)."""
    known = {}
    for target, kind in targets.items():
        target_name, _, target_version = target.rpartition("@")
        if target_name == name:
            known[target_version] = kind
    return known


def check_known(name: str, version: str | None, targets: dict[str, str], where: str) -> None:
    """Refuse, in one line, a ``name`` (or ``name@version``) that is not among ``targets``
    (``name@version`` -> kind, from ``where``): the names there are listed and the
    closest one suggested."""
    known = versions_of(name, targets)
    if not known:
        by_kind: dict[str, set[str]] = {"agent": set(), "workflow": set()}
        for target, kind in targets.items():
            by_kind.setdefault(kind, set()).add(target.rpartition("@")[0])
        names = set().union(*by_kind.values())
        close = difflib.get_close_matches(name, sorted(names), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        if names:
            listing = "; ".join(
                f"{kind}s: {', '.join(sorted(found)) or 'none'}" for kind, found in by_kind.items()
            )
            raise UnknownTargetError(
                f"unknown agent or workflow {name!r} {where}; {hint}({listing})"
            )
        raise UnknownTargetError(
            f"unknown agent or workflow {name!r} ({where}: none); start a worker with "
            "its app first, or pass --app module:app"
        )
    if version is not None and version not in known:
        listing = ", ".join(sorted(known, key=version_key, reverse=True))
        raise UnknownTargetError(f"unknown version {name}@{version} (versions {where}: {listing})")


def choose_version(
    name: str,
    version: str | None,
    targets: dict[str, str],
    live: set[str],
    where: str,
) -> tuple[str, str, bool]:
    """(version, kind, served) for a submit of ``name``.

    ``targets``: ``name@version`` -> kind of every definition (from ``where``);
    ``live``: the versions of ``name`` live workers have. Raises a one-line
    :class:`UsageError` when nothing fits, saying how to proceed.
    """
    check_known(name, version, targets, where)
    known = versions_of(name, targets)
    if version is not None:
        return version, known[version], version in live
    served = [v for v in known if v in live]
    if not served:
        listing = ", ".join(sorted(known, key=version_key, reverse=True))
        raise UsageError(
            f"no live worker runs {name} (known versions: {listing}); start a worker "
            f"(agentledger worker --app MODULE:ATTR), or pass --version to queue it anyway"
        )
    best = max(served, key=version_key)
    return best, known[best], True
