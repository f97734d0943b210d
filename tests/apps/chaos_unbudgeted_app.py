"""``chaos_app`` on a runtime that never finds a budget reached: the attack the checks
between steps stop. ``agentledger chaos`` must report the steps started past the budget."""

from __future__ import annotations

from typing import Any

from agentledger._budget import Budget
from tests.apps.chaos_app import app

__all__ = ["app"]


def _never(self: Budget, *args: Any, **kwargs: Any) -> str | None:
    return None


Budget.exceeded = _never  # type: ignore[method-assign]
