"""Plain records the store returns and the engine passes around."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum, nonmember
from typing import Any

from agentledger._canonical import clean_text, one_shot


class RunStatus(StrEnum):
    """Run states (docs/architecture.md, "Run states")."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    NEEDS_HUMAN = "needs_human"

    ALL = nonmember((QUEUED, RUNNING, WAITING, COMPLETED, FAILED, CANCELLED, EXPIRED, NEEDS_HUMAN))
    TERMINAL = nonmember(frozenset({COMPLETED, FAILED, CANCELLED, EXPIRED, NEEDS_HUMAN}))


class StepStatus(StrEnum):
    """Journal entry states. ``retrying``: parked for a later attempt; ``waiting``: for approval.

    ``NEW`` marks a step built in memory and not journaled yet; it is never stored.
    """

    NEW = ""
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RETRYING = "retrying"
    WAITING = "waiting"  # parked for an approval


class EffectStatus(StrEnum):
    """States of an effects-table guard (:class:`Effect`)."""

    CLAIMED = "claimed"  # a call may be under way: its outcome is unknown until settled
    DONE = "done"
    FAILED = "failed"


class DeliveryStatus(StrEnum):
    """States of a delivery: an outbox row (:class:`OutboxItem`) or a webhook delivery."""

    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"  # its retries are used up: an operator retries or drops it


class ApprovalDecision(StrEnum):
    """What a human (or an approval's expiry) decides."""

    APPROVE = "approve"
    REJECT = "reject"


#: Where a failed run's error turns from its message to its traceback: the engine keeps
#: both in ``runs.error`` (engine/_runner.py), readers show the message and the
#: traceback only when asked.
TRACEBACK_START = "\nTraceback (most recent call last):\n"


def error_parts(error: str | None) -> tuple[str, str]:
    """A run's ``error`` as (message, traceback); the traceback is "" when it has none."""
    if not error:
        return "", ""
    at = error.find(TRACEBACK_START)
    if at < 0:
        return error, ""
    return error[:at], error[at + 1 :]


def target_of(name: str, version: str) -> str:
    """The claimable identity of an agent or workflow: ``name@version``."""
    return f"{name}@{version}"


@dataclass
class Run:
    """One row of ``runs``."""

    id: str
    tenant_id: str
    user_id: str | None
    kind: str
    name: str
    version: str
    input: Any
    status: str
    step_count: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    active_seconds: float = 0.0
    created_at: float = 0.0
    updated_at: float = 0.0
    lease_owner: str | None = None
    lease_epoch: int = 0
    lease_expires_at: float | None = None
    available_at: float | None = None
    resumes: int = 0
    result: Any = None
    error: str | None = None
    handover_reason: str | None = None
    cancel_requested: str | None = None  # reason; honoured at the next step boundary
    request_id: str | None = None  # the submit's request id (a retried submit finds its run)
    # Who started the run through the API: {"key_id", "tenant_id", "user_id", "roles"}.
    principal: dict[str, Any] | None = None
    # Its tokens and cost were simulated: an offline scripted model answered a model step.
    usage_simulated: bool = False
    # When the store was restored from a backup while this run was not terminal: its
    # journal may be older than the providers' ledgers (engine/_unknown.py).
    restored_at: float | None = None

    @property
    def target(self) -> str:
        return target_of(self.name, self.version)

    @property
    def terminal(self) -> bool:
        return self.status in RunStatus.TERMINAL

    @property
    def failure(self) -> str:
        """Why a failed run failed, in one line: its error class (when the error does
        not start with it) and the first line of its message; "" for any other run."""
        if self.status != RunStatus.FAILED:
            return ""
        first = error_parts(self.error)[0].split("\n", 1)[0].strip()
        kind = self.handover_reason or ""  # a failed run's error class, when it has one
        if kind and not first.startswith(f"{kind}:") and kind != first:
            first = f"{kind}: {first}" if first else kind
        return first


@dataclass
class Step:
    """One journal entry (one row of ``steps``)."""

    run_id: str
    step_no: int
    kind: str
    name: str
    status: str
    input: Any = None
    input_hash: str | None = None
    output: Any = None
    attempts: int = 0
    idempotency_key: str | None = None
    started_at: float | None = None
    duration_ms: float | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    error_class: str | None = None
    error: str | None = None
    lease_epoch: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def took_effect(self) -> bool:
        """Whether its call happened: it succeeded, or it applied and its result could
        not be journaled (failed ``not_journalable``, a fault of the tool)."""
        return self.status == StepStatus.SUCCEEDED or (
            self.status == StepStatus.FAILED and self.error_class == "not_journalable"
        )

    def outcome_unknown(self) -> bool:
        """Whether this write (a tool or compensation step) may have applied without its
        outcome journaled: ``started`` or ``unknown``, or ``retrying`` after an attempt
        that may have reached the provider."""
        if self.kind not in ("tool", "compensation"):
            return False
        if self.status in (StepStatus.STARTED, StepStatus.UNKNOWN):
            return True
        retry = self.output.get("retry") if isinstance(self.output, dict) else None
        return (
            self.status == StepStatus.RETRYING
            and isinstance(retry, dict)
            and bool(retry.get("maybe_applied"))
        )


@dataclass
class Effect:
    """An effects-table guard for a side effect whose provider has no keys."""

    key: str
    run_id: str
    step_no: int
    status: str
    result: Any = None


@dataclass
class OutboxItem:
    """A side effect to deliver later (email, CRM) with its own retries."""

    key: str
    run_id: str
    step_no: int
    tool: str
    payload: Any
    attempts: int = 0
    next_attempt_at: float = 0.0
    status: str = DeliveryStatus.PENDING
    last_error: str | None = None
    history: list[Any] = field(default_factory=list)
    # The claim this copy was handed out under: a settle must carry both, so a
    # dispatcher whose lease expired and was re-claimed cannot settle the row.
    lease_owner: str | None = None
    claim_epoch: int = 0


@dataclass
class Approval:
    """A proposed action waiting for a human decision."""

    id: str
    run_id: str
    step_no: int
    tool: str
    arguments: Any
    required_role: str
    requested_at: float
    expires_at: float
    default_decision: str
    decision: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    # The policy's conditions (policies.RequireApproval): the user who started the run,
    # whether that user is barred from deciding, how many distinct approvers it takes,
    # and who approved so far.
    requested_by: str | None = None
    not_requester: bool = False
    approvals_needed: int = 1
    approvers: list[str] = field(default_factory=list)


@dataclass
class Event:
    """One append-only audit event."""

    id: int
    run_id: str
    at: float
    type: str
    actor: str
    data: Any


@dataclass
class WorkerInfo:
    """A live (or recently live) worker process."""

    id: str
    host: str
    pid: int
    targets: list[str]
    started_at: float
    heartbeat_at: float
    draining: bool = False  # started with --exit-when-drained


# json.dumps(value, separators=(",", ":"), default=str), made once. No cycle check: a
# value with a cycle fails as too deep (RecursionError) instead.
_ENCODE = one_shot(json.JSONEncoder(separators=(",", ":"), default=str, check_circular=False))


def dumps(value: Any) -> str:
    """Compact JSON used for every JSON column.

    Text is sanitized (:func:`agentledger._canonical.clean_text`): a NUL or a lone
    UTF-16 surrogate anywhere in ``value`` comes back as U+FFFD, so what the journal
    returns can be written anywhere else (a text column, a provider) without failing.
    """
    text = _ENCODE(value)
    # ASCII JSON spells NUL and every surrogate as an escape: only then walk the value.
    if "\\u0000" in text or "\\ud" in text:
        text = json.dumps(_clean(json.loads(text)), separators=(",", ":"))
    return text


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(k): _clean(v) for k, v in value.items()}
    return value


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
