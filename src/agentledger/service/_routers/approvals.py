"""``/v1/approvals``: what the caller may decide, and decisions by role.

A decision names the hash of the exact arguments it was shown (``arguments_hash``, as
listed); a decision on other arguments is refused (409), and execution re-checks the
hash against the journaled call (engine/_approvals.py). 403 without the role, 404 for
another tenant's approval, 409 already decided (by whom), 410 expired.

Expiry is judged on the service's clock (``app.state.clock`` when set, else the real
clock), by the store alone, in the statement that records the decision while the row is
held: a decision that reaches the database at or after ``expires_at`` is refused (410)
and records nothing, and one sent again after expiry whose first attempt committed
before it (a vote included) is answered with what was recorded. No key whose user is in
the ``system:`` namespace decides (403).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from agentledger._canonical import clean_text
from agentledger._clock import SYSTEM, Clock
from agentledger.records import Approval
from agentledger.service._auth import APPROVER, Caller, Principal
from agentledger.service._cursors import make_cursor, parse_cursor
from agentledger.service._problems import PROBLEM_SCHEMA, Problem
from agentledger.service._queries import approvals as service_approvals
from agentledger.service._views import approval_view, arguments_hash
from agentledger.store import AlreadyDecided
from agentledger.store._queries.approvals import SYSTEM_PREFIX, ApprovalExpired, NotPermitted

router = APIRouter(prefix="/v1/approvals", tags=["approvals"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: PROBLEM_SCHEMA for code in (401, 403, 404, 409, 410, 422)
}
EXPIRED_BY = "system:expired"  # engine/_approvals.py: the expiry default's decider
_PAGE = 200  # approvals read per store round trip while listing
_MAX_PAGES = 25  # store reads per listing request at most (then next_cursor goes on)


def may_decide(p: Principal, required_role: str, run_user: str | None) -> bool:
    """The role the approval names (or ``approver``/``admin``); a ``guest`` approval is
    decided by the run's own user."""
    if p.has(APPROVER):
        return True
    if required_role not in p.roles:
        return False
    return required_role != "guest" or p.user_id == run_user


def awaits(p: Principal, a: Approval, now: float) -> bool:
    """True when ``a`` still waits for a decision ``p`` may make: undecided and not
    expired, ``p`` is not the requester where the policy bars them (``not_requester``),
    and ``p`` has not approved it already (an approval needing several approvers)."""
    if a.decision is not None or a.expires_at <= now:
        return False
    user = clean_text(p.user_id)
    if a.not_requester and a.requested_by is not None and user == a.requested_by:
        return False
    return user not in a.approvers


def clock_of(request: Request) -> Clock:
    """The service's clock: ``app.state.clock`` when set (tests inject one), else the
    real clock. Approvals' ``expires_at`` are on the workers' clock, likewise real."""
    clock = getattr(request.app.state, "clock", None)
    return clock if isinstance(clock, Clock) else SYSTEM


def _view(item: dict[str, Any], now: float) -> dict[str, Any]:
    a = item["approval"]
    view = approval_view(a) or {}
    view["agent"] = item["agent"]
    view["run_user"] = item["run_user"]
    view["expired"] = a.decision is None and a.expires_at <= now
    return view


class ApprovalDecisionBody(BaseModel):
    """``POST /v1/approvals/{id}/decision``."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    arguments_hash: str = Field(
        min_length=64, max_length=64, description="arguments_hash of the approval as listed"
    )
    reason: str | None = Field(default=None, max_length=2000)


@router.get("", responses={**ERRORS, 400: PROBLEM_SCHEMA})
async def list_approvals(
    request: Request,
    principal: Caller,
    status: Literal["pending", "all"] = "pending",
    limit: int = Query(100, ge=1, le=500),
    cursor: str | None = Query(None, max_length=400, description="next_cursor of a page"),
) -> dict[str, Any]:
    """What the caller may decide: approvals of the caller's tenant needing a role the
    caller holds (a ``guest`` approval: the run's own user), not expired, not the
    caller's own run where the policy requires another approver, not approved by the
    caller already; each with the proposed action (``tool``) and its server-computed
    ``arguments`` (e.g. the amount). ``status=all``: every approval of those roles,
    decided ones included. Oldest first; ``next_cursor`` (when not null) continues."""
    store = request.app.state.store
    pending, now = status == "pending", clock_of(request).now()
    shown: list[dict[str, Any]] = []
    after = parse_cursor(cursor)
    # Filtered here (one rule with the decision endpoint), so the store is paged by
    # keyset until ``limit`` are shown: a page of others' approvals hides nothing. The
    # scan is bounded; where it stops, ``next_cursor`` says where to go on.
    for _ in range(_MAX_PAGES):
        batch = await store.read(
            lambda tx, after=after: service_approvals.tenant_approvals(
                tx, principal.tenant_id, pending, _PAGE, after
            )
        )
        for item in batch:
            a = item["approval"]
            after = (a.requested_at, a.id)
            if not may_decide(principal, a.required_role, item["run_user"]):
                continue
            if pending and not awaits(principal, a, now):
                continue
            shown.append(_view(item, now))
            if len(shown) == limit:
                return {"approvals": shown, "next_cursor": make_cursor(*after)}
        if len(batch) < _PAGE:
            return {"approvals": shown, "next_cursor": None}
    return {"approvals": shown, "next_cursor": make_cursor(*after) if after else None}


@router.post("/{approval_id}/decision", responses=ERRORS)
async def decide(
    approval_id: str, body: ApprovalDecisionBody, request: Request, principal: Caller
) -> dict[str, Any]:
    """Approve or reject. Exactly one decision wins; none is recorded at or after the
    approval's expiry (410)."""
    store = request.app.state.store
    clock = clock_of(request)
    item = await store.read(service_approvals.tenant_approval, approval_id, principal.tenant_id)
    if item is None:
        raise Problem("not-found", f"no approval {approval_id}")
    a = item["approval"]
    if not may_decide(principal, a.required_role, item["run_user"]):
        raise Problem(
            "forbidden", f"approval {approval_id} needs the role {a.required_role}"
            + (" and the run's own user" if a.required_role == "guest" else ""),
        )  # fmt: skip
    if clean_text(principal.user_id).startswith(SYSTEM_PREFIX):
        # The expiry default's and cancel's namespace: the store exempts it from the
        # expiry rule and the policy's conditions, so no key may decide as it.
        raise Problem("forbidden", f"user {principal.user_id} may not decide approvals")
    if a.decision is not None and not (
        a.decision == body.decision and a.decided_by == principal.user_id
    ):
        # Decided by someone else: final, whatever this read's age. An undecided one is
        # judged by the store alone, holding the row: a read that finds it undecided
        # and past expiry may be older than this decider's own first attempt, judged
        # before expiry and committing now (its reply lost); the store answers that
        # retry with the recorded decision, and refuses a late decision (410).
        _check_open(a, clock)
    if body.arguments_hash != arguments_hash(a.arguments):
        raise Problem(
            "arguments-changed",
            "arguments_hash does not match the approval's arguments; list it again",
        )
    context = {
        "approval_id": approval_id,
        "key_id": principal.key_id,
        "roles": sorted(principal.roles),
        "arguments_hash": body.arguments_hash,
        "reason": body.reason,
        "request_id": getattr(request.state, "request_id", None),
    }
    via = getattr(request.state, "via", None)  # the console calls this handler too
    if via:
        context["via"] = via
    try:
        decided, _ = await store.transact(
            service_approvals.decide_with_context,
            approval_id,
            body.decision,
            principal.user_id,
            context,
            clock,
        )
    except AlreadyDecided as exc:
        _check_open(exc.approval, clock)
        raise AssertionError("unreachable") from exc
    except ApprovalExpired as exc:  # expired by the time the decision held the row
        raise Problem(
            "expired", f"approval {approval_id} expired at {exc.approval.expires_at}"
        ) from exc
    except NotPermitted as exc:  # the policy's conditions (e.g. not the requester)
        raise Problem("forbidden", str(exc)) from exc
    return _view({**item, "approval": decided}, clock.now())


def _check_open(a: Any, clock: Clock) -> None:
    if a.decision is not None:
        if a.decided_by == EXPIRED_BY:
            raise Problem(
                "expired", f"approval {a.id} expired; the default ({a.decision}) was applied"
            )
        raise Problem(
            "already-decided",
            f"approval {a.id} was already decided by {a.decided_by}: {a.decision}",
            decided_by=a.decided_by,
            decision=a.decision,
        )
    if a.expires_at <= clock.now():
        raise Problem("expired", f"approval {a.id} expired at {a.expires_at}")
