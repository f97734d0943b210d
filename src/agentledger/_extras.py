"""The optional parts of agentledger and the one line that says which to install.

``pip install agentledger`` is the core: embedding the engine on SQLite, the worker and
the commands that read and decide runs. Everything else is an extra of the
distribution (pyproject.toml) whose modules are imported only where they are used; a
command that needs one it does not find says so in one line and exits non-zero:

    agentledger serve needs the service extra: pip install 'agentledger[service]'

The examples (``agentledger demo``, ``sandbox``, ``example``) and the benchmarks
(``agentledger bench``) are installables of their own in the repository
(``examples/`` and ``bench/``), not extras: :data:`PACKAGES` names them.
"""

from __future__ import annotations

import importlib.util

from agentledger.errors import UsageError

#: Each extra and the modules that tell whether it is installed.
EXTRAS: dict[str, tuple[str, ...]] = {
    "service": ("fastapi", "uvicorn", "jinja2"),
    "postgres": ("psycopg",),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
    "metrics": ("prometheus_client",),
    "openai": ("openai",),
    "anthropic": ("anthropic",),
    "embeddings": ("wordllama", "numpy"),
}

#: The installables beside the runtime: (their top-level module, how to install them).
PACKAGES: dict[str, tuple[str, str]] = {
    "examples": ("agentledger_examples", "pip install -e ./examples (from a checkout)"),
    "bench": ("agentledger_bench", "pip install -e ./bench (from a checkout)"),
}


class ExtraNotInstalled(UsageError):
    """A command or feature needs an extra (or a package) that is not installed."""


class MissingFeature(UsageError):
    """The kernel needs a feature package this process never imported: the hook or seam
    it registers when imported is missing where going on without it would spend money
    unchecked or leave the audit chain unsealed (``engine/_hooks.py``,
    ``agentledger/_auditchain.py``). The message names the module to import."""


def installed(module: str) -> bool:
    """True when ``module`` can be imported (found, not imported: nothing runs)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package; a module without spec
        return False


def missing(extra: str) -> str | None:
    """The first module of ``extra`` that is not installed, or None."""
    return next((m for m in EXTRAS[extra] if not installed(m)), None)


def hint(extra: str, what: str) -> str:
    """``WHAT needs the EXTRA extra: pip install 'agentledger[EXTRA]'``."""
    return f"{what} needs the {extra} extra: pip install 'agentledger[{extra}]'"


def require(extra: str, what: str) -> None:
    """Raise :class:`ExtraNotInstalled` with :func:`hint` when ``extra`` is missing."""
    if missing(extra) is not None:
        raise ExtraNotInstalled(hint(extra, what))


def package_hint(package: str, what: str) -> str:
    """``WHAT needs agentledger's PACKAGE: pip install -e ./PACKAGE (from a checkout)``."""
    return f"{what} needs agentledger's {package}: {PACKAGES[package][1]}"


__all__ = [
    "EXTRAS",
    "PACKAGES",
    "ExtraNotInstalled",
    "hint",
    "installed",
    "missing",
    "package_hint",
    "require",
]
