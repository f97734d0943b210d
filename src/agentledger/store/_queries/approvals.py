"""Approvals: a proposed action waiting for a human decision."""

from __future__ import annotations

from agentledger._canonical import clean_text
from agentledger._clock import SYSTEM, Clock
from agentledger.errors import StoreError
from agentledger.records import (
    Approval,
    ApprovalDecision,
    dumps,
    loads,
)
from agentledger.store import _rows as rows
from agentledger.store._base import AlreadyDecided
from agentledger.store._queries.events import insert_event
from agentledger.store._tx import Tx

SYSTEM_PREFIX = "system:"


class NotPermitted(StoreError):
    """The approval's policy refuses this decider (e.g. the run's own user)."""


class ApprovalExpired(StoreError):
    """A person's decision (or approver's vote) reached the store at or after the
    approval's ``expires_at`` by the decider's clock: nothing was recorded, and the
    expiry's default decides (``approval`` holds the row as it was found)."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(
            f"approval {approval.id} expired at {approval.expires_at}; the decision was not "
            f"recorded (the default, {approval.default_decision}, applies)"
        )
        self.approval = approval


def _conditions(tx: Tx, approval_id: str, decision: str, by: str, now: float) -> Approval | None:
    """Check the policy's conditions; None when this decision is the deciding one,
    else the approval with ``by`` added to its approvers (still undecided). A vote is
    recorded only while ``now`` (the decider's clock) is before ``expires_at``."""
    for _ in range(20):  # optimistic: re-read when another approver got in between
        found = tx.fetchall("SELECT * FROM approvals WHERE id = :id", {"id": approval_id})
        if not found:
            return None  # the UPDATE path reports the missing approval
        a = rows.approval_from(found[0])
        if a.decision is not None:
            return None  # the UPDATE path reports who decided (or a retry's own decision)
        if a.not_requester and a.requested_by is not None and by == a.requested_by:
            raise NotPermitted(
                f"approval {a.id} may not be decided by {by}, the user who started the run"
            )
        if decision != ApprovalDecision.APPROVE or a.approvals_needed <= 1:
            return None
        if by in a.approvers:
            return a  # this approver's approval is recorded already (a retry)
        if len(a.approvers) + 1 >= a.approvals_needed:
            return None  # the last approver needed: the decision is recorded
        old = dumps(a.approvers) if a.approvers else None
        changed = tx.execute(
            "UPDATE approvals SET approvers = :new WHERE id = :id AND decision IS NULL "
            "AND COALESCE(approvers, '') = COALESCE(:old, '') AND expires_at > :now",
            {"new": dumps([*a.approvers, by]), "id": a.id, "old": old, "now": now},
        )
        if changed:
            a.approvers = [*a.approvers, by]
            insert_event(
                tx, a.run_id, "approval.approved_by", by,
                {"approval_id": a.id, "approvers": a.approvers, "needed": a.approvals_needed},
            )  # fmt: skip
            return a
        if now >= a.expires_at:
            raise ApprovalExpired(a)  # the vote came too late: refused by the guard above
    raise StoreError(f"approval {approval_id}: too many concurrent approvers, retry")


def insert_approval(tx: Tx, a: Approval) -> None:
    tx.execute(
        "INSERT INTO approvals (id, run_id, step_no, tool, arguments, required_role, "
        "requested_at, expires_at, default_decision, requested_by, not_requester, "
        "approvals_needed) VALUES (:id, :run_id, :step_no, :tool, :arguments, :role, "
        ":requested_at, :expires_at, :default, :requested_by, :not_requester, :needed) "
        "ON CONFLICT (run_id, step_no) DO NOTHING",
        {
            "id": a.id,
            "run_id": a.run_id,
            "step_no": a.step_no,
            "tool": a.tool,
            "arguments": dumps(a.arguments),
            "role": a.required_role,
            "requested_at": a.requested_at,
            "expires_at": a.expires_at,
            "default": a.default_decision,
            "requested_by": a.requested_by,
            "not_requester": int(a.not_requester),
            "needed": max(1, int(a.approvals_needed)),
        },
    )


def get_approvals(tx: Tx, run_id: str | None = None, pending: bool = False) -> list[Approval]:
    where, params = [], {}
    if run_id:
        where.append("run_id = :run_id")
        params["run_id"] = run_id
    if pending:
        where.append("decision IS NULL")
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    found = tx.fetchall(f"SELECT * FROM approvals {clause} ORDER BY requested_at", params)
    return [rows.approval_from(r) for r in found]


def decide_approval(
    tx: Tx,
    approval_id: str,
    decision: str,
    decided_by: str,
    clock: Clock | None = None,
) -> Approval:
    """Record a decision: one atomic UPDATE ... WHERE decision IS NULL, row count checked.

    Exactly one decision wins (a human's and the expiry's racing included). A losing
    different decision raises :class:`AlreadyDecided` naming the winner; the same decider
    repeating the same decision -- a retry, e.g. after a lost COMMIT reply -- gets the
    recorded approval back.

    A person's decision is recorded only before the approval expires: the UPDATE itself
    requires ``expires_at > now``, ``now`` read from ``clock`` (the deciding side's clock:
    the service's, the CLI's; the real clock by default) while the row is held, so a
    decision that reaches the database at or after expiry records nothing and raises
    :class:`ApprovalExpired`, however recent the caller's own check was; the expiry's
    default then decides. ``expires_at`` is written on the engine's clock, so the
    decider's clock -- not the database's -- is the one it is compared with.

    The policy's conditions are enforced here, where every decider passes: a
    ``not_requester`` approval refuses the run's own user (:class:`NotPermitted`), and an
    approval needing N approvers records each distinct one (each vote under the same
    expiry rule) and is decided ``approve`` only by the N-th (one reject decides at
    once). System deciders (``system:...``, the expiry default and cancel) are not
    subject to them, nor to the expiry rule.
    """
    system = decided_by.startswith(SYSTEM_PREFIX)
    guard, now = "", 0.0
    if not system:
        # Hold the row before reading the clock (PostgreSQL: its row lock; SQLite's
        # transaction holds the write lock since BEGIN IMMEDIATE): a decision is judged
        # by the time at which it holds the row, not by when the request began, and the
        # expiry default cannot commit in between.
        tx.execute("UPDATE approvals SET decision = decision WHERE id = :id", {"id": approval_id})
        now = (clock or SYSTEM).now()
        guard = " AND expires_at > :now"
        pending = _conditions(tx, approval_id, decision, clean_text(decided_by), now)
        if pending is not None:
            return pending  # approved by this decider; more approvers are needed
    changed = tx.execute(
        "UPDATE approvals SET decision = :decision, decided_by = :by, "
        f"decided_at = {tx.now}, approvers = CASE WHEN :decision = 'approve' AND "
        ":system = 0 THEN :approvers ELSE approvers END WHERE id = :id AND decision IS NULL"
        + guard,
        {
            "decision": decision,
            "by": decided_by,
            "id": approval_id,
            "system": int(system),
            "approvers": _with_approver(tx, approval_id, clean_text(decided_by)),
            "now": now,
        },
    )
    found = tx.fetchall("SELECT * FROM approvals WHERE id = :id", {"id": approval_id})
    if not found:
        raise StoreError(
            f"no approval {clean_text(approval_id)!r}; list them with `agentledger approvals list`"
        )
    approval = rows.approval_from(found[0])
    if changed == 0:
        if approval.decision is None:
            raise ApprovalExpired(approval)  # undecided, so the expiry guard refused it
        if approval.decision == decision and approval.decided_by == clean_text(decided_by):
            return approval  # this decider's own decision, committed before: a retry
        raise AlreadyDecided(approval)
    # The decision re-queues the run: a worker picks it up and reads the decision.
    tx.execute(
        f"UPDATE runs SET available_at = {tx.now}, updated_at = {tx.now} "
        "WHERE id = :run_id AND status = 'waiting'",
        {"run_id": approval.run_id},
    )
    tx.dialect.notify_runnable(tx.conn)
    insert_event(
        tx,
        approval.run_id,
        "approval.decided",
        decided_by,
        {"approval_id": approval_id, "decision": decision, "tool": approval.tool},
    )
    return approval


def _with_approver(tx: Tx, approval_id: str, by: str) -> str:
    """The approvers list with the deciding approver appended (JSON)."""
    found = tx.fetchall("SELECT approvers FROM approvals WHERE id = :id", {"id": approval_id})
    earlier = loads(found[0]["approvers"]) if found and found[0]["approvers"] else []
    return dumps(earlier if by in earlier else [*earlier, by])
