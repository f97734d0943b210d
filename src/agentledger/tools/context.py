"""What a tool receives besides its arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentledger.clock import SYSTEM, Clock


@dataclass
class ToolContext:
    """The run, the step, the deterministic idempotency key, the time left, the user.

    ``idempotency_key`` is ``run_id:step_no`` (a workflow step may extend it); it
    is the same on every retry, after every restart and on every worker, and the
    tool must pass it to its provider.
    """

    run_id: str
    step_no: int
    idempotency_key: str
    deadline: float  # clock.monotonic() by which the call must finish
    tenant_id: str
    user_id: str | None
    attempt: int = 1
    run_input: Any = None
    resources: dict[str, Any] = field(default_factory=dict)
    clock: Clock = field(default=SYSTEM, repr=False)
    # The worker's store (an agentledger.store.Store): memory and retrieval tools read
    # and write the run's tenant's rows through it. None outside a worker.
    store: Any = field(default=None, repr=False)

    def time_left(self) -> float:
        """Seconds left before this call's deadline."""
        return max(0.0, self.deadline - self.clock.monotonic())
