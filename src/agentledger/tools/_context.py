"""What a tool receives besides its arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentledger._clock import SYSTEM, Clock


@dataclass(frozen=True)
class Principal:
    """Who started the run: the tool acts with these permissions, never a service account.

    Recorded on the run at creation (the API key's user and roles). ``key_id`` names the
    key, never its secret; a tool that needs a credential is given its *name* (a
    reference it resolves from its own resources), so no secret reaches the journal.
    A run started outside the API has its user and no roles.
    """

    tenant_id: str
    user_id: str | None
    roles: frozenset[str] = frozenset()
    key_id: str | None = None

    def has(self, *roles: str) -> bool:
        """True when the principal holds any of ``roles``."""
        return bool(self.roles & set(roles))

    @classmethod
    def of_run(
        cls, tenant_id: str, user_id: str | None, recorded: dict[str, Any] | None
    ) -> Principal:
        """The principal a run recorded at creation (or its bare user)."""
        if not recorded:
            return cls(tenant_id, user_id)
        return cls(
            tenant_id,
            recorded.get("user_id", user_id),
            frozenset(recorded.get("roles") or ()),
            recorded.get("key_id"),
        )


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
    # Who started the run (see Principal); None only for contexts built by hand.
    principal: Principal | None = None

    def time_left(self) -> float:
        """Seconds left before this call's deadline."""
        return max(0.0, self.deadline - self.clock.monotonic())
