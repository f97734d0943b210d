"""Policy decisions: code that runs before every tool call.

A policy is a function of the proposed call that returns :class:`Allow`,
:class:`Deny` (the model is told ``not_allowed``) or :class:`RequireApproval`
(the run parks until a human with the role decides, or the approval expires and
its default applies).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentledger.records import ApprovalDecision


@dataclass(frozen=True)
class Allow:
    """Let the call go ahead."""


@dataclass(frozen=True)
class Deny:
    """Refuse the call; the model gets ``not_allowed`` and the reason."""

    reason: str


@dataclass(frozen=True)
class RequireApproval:
    """Park the run until someone with ``role`` decides.

    ``not_requester``: the user who started the run may not decide it (four eyes).
    ``approvals_needed``: that many distinct approvers must approve (one reject
    decides); a policy asks for 2 above its threshold, e.g.
    ``RequireApproval("manager", approvals_needed=2 if amount > 1000 else 1)``.
    Both are enforced by the store, whoever decides (API, CLI). Unless given,
    an approval expires after 24 hours and is then rejected (``default``), by the
    workers, whether or not anyone looks.
    """

    role: str
    expires_in: float = 24 * 3600.0
    default: str = ApprovalDecision.REJECT  # applied on expiry
    not_requester: bool = False
    approvals_needed: int = 1

    def __post_init__(self) -> None:
        if self.approvals_needed < 1:
            raise ValueError(f"approvals_needed must be at least 1, not {self.approvals_needed}")


Decision = Allow | Deny | RequireApproval


@dataclass(frozen=True)
class ProposedCall:
    """A tool call the model (or workflow) proposes, with the server's values filled in."""

    run_id: str
    step_no: int
    tool: str
    arguments: dict[str, Any]
    user_id: str | None
    tenant_id: str
    run_input: Any


Policy = Callable[[ProposedCall], Decision | Awaitable[Decision]]


async def run_policy(policy: Policy, call: ProposedCall) -> Decision:
    """Run a (sync or async) policy (the engine allows every call when there is none)."""
    decision = policy(call)
    if inspect.isawaitable(decision):
        decision = await decision
    if not isinstance(decision, Allow | Deny | RequireApproval):
        raise TypeError(
            f"policy returned {decision!r}; return Allow(), Deny(...) or RequireApproval(...)"
        )
    return decision
