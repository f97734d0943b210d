"""Names a package exports but loads on first use (PEP 562): importing the package stays
cheap for a process that needs only part of it (a command that runs no steps, an app
that never starts a worker)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(
    package: str, sources: dict[str, str], exported: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``sources`` is
    imported from its module when first read, then kept in the package's namespace (the
    next read finds it without calling back here)."""

    def getattr_(name: str) -> Any:
        module = sources.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exported})

    return getattr_, dir_
