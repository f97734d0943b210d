"""Which version a plain ``submit`` runs: the newest one a live worker has.

Routing to the newest version ever registered sends runs to a version nobody runs any
more (a stopped canary) and they wait forever. A version given explicitly is queued
whatever the workers (it waits until one starts).
"""

from __future__ import annotations

from typing import Any

from agentledger.errors import UnknownTargetError, UsageError

# A worker whose last heartbeat is older than this is not counted as live.
LIVE_WITHIN = 60.0


def version_key(version: str) -> tuple[Any, ...]:
    """Order versions numerically where they are numbers: "10" > "9", "1.10" > "1.9"."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in version.split("."))


def choose_version(
    name: str,
    version: str | None,
    known: dict[str, str],
    live: set[str],
    where: str,
) -> tuple[str, str, bool]:
    """(version, kind, served) for a submit of ``name``.

    ``known``: version -> kind of every definition of ``name`` (from ``where``);
    ``live``: the versions of ``name`` live workers have. Raises a one-line
    :class:`UsageError` when nothing fits, saying how to proceed.
    """
    if version is not None:
        if version not in known:
            listing = ", ".join(sorted(known, key=version_key, reverse=True)) or "none"
            raise UnknownTargetError(
                f"unknown version {name}@{version} (versions {where}: {listing})"
            )
        return version, known[version], version in live
    if not known:
        raise UnknownTargetError(
            f"unknown agent or workflow {name!r} ({where}: none); start a worker with "
            "its app first, or pass --app module:app"
        )
    served = [v for v in known if v in live]
    if not served:
        listing = ", ".join(sorted(known, key=version_key, reverse=True))
        raise UsageError(
            f"no live worker runs {name} (known versions: {listing}); start a worker "
            f"(agentledger worker --app MODULE:ATTR), or pass --version to queue it anyway"
        )
    best = max(served, key=version_key)
    return best, known[best], True
