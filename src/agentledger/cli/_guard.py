"""How the ``agentledger`` command ends on an error: one line on stderr, a non-zero exit.

Light on purpose: the command's entry imports it before it knows which command runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from agentledger._failures import cause_of
from agentledger.errors import AgentLedgerError, UsageError


def debug_enabled() -> bool:
    """``AGENTLEDGER_DEBUG`` is on; off when any variable is unusable (the error about it
    is what is being shown)."""
    from agentledger import _envsettings as envsettings  # loads pydantic-settings

    try:
        return envsettings.current().debug
    except UsageError:
        return False


def fail(message: str, code: int = 2) -> None:
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(code)


def guarded(main: Callable[[], Any]) -> Callable[[], Any]:
    """Turn known errors into one line on stderr and a non-zero exit."""

    @wraps(main)
    def wrapper() -> Any:
        try:
            return main()
        except AgentLedgerError as exc:
            if debug_enabled():
                raise
            fail(cause_of(exc))
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper
