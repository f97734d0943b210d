"""``chaos_app`` on a runtime whose replay forgets succeeded steps: the attack "resume is
not restart" stops.

Imported by the chaos test's workers in place of the real app, it makes
``Execution.prior`` answer "never ran" for a step the journal records as succeeded, so a
resumed run calls its writes again (with the same keys). ``agentledger chaos`` must
report each effect that follows a step's ``step.succeeded``.
"""

from __future__ import annotations

from typing import Any

from agentledger.engine._execution import Execution
from agentledger.records import Step, StepStatus
from tests.apps.chaos_app import app

__all__ = ["app"]

_remembered = Execution.prior


def _forgetful(self: Execution, *args: Any, **kwargs: Any) -> Step | None:
    step = _remembered(self, *args, **kwargs)
    return None if step is not None and step.status == StepStatus.SUCCEEDED else step


Execution.prior = _forgetful  # type: ignore[method-assign]
