"""The records the store takes from its callers, and the errors it refuses them with.

The one write the engine makes while a run executes is
:meth:`~agentledger.store._sqlstore.Store.commit` of a :class:`Batch`: every journal write,
run counter, effect claim, outbox row, approval and audit event that a step decides goes
into one batch, and the batch is *fenced* -- it commits only if the run's lease epoch is
still the writer's. The store groups many runs' batches into one durable transaction
(group commit) and resolves each caller only after that transaction is durable.
"""

from __future__ import annotations

import itertools
import os
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agentledger.errors import StoreError
from agentledger.records import (
    Approval,
    Effect,
    OutboxItem,
    Step,
)

if TYPE_CHECKING:
    pass

T = TypeVar("T")
_UNSET: Any = object()

# Batch tokens: a random prefix per process and a counter. Unique per batch like a fresh
# random token, without a system call per batch; a forked child draws its own prefix,
# so parent and child never hand out the same token.
_token_prefix = secrets.token_hex(8)
_token_counter = itertools.count(1)


def _new_prefix() -> None:
    global _token_prefix, _token_counter
    _token_prefix = secrets.token_hex(8)
    _token_counter = itertools.count(1)


os.register_at_fork(after_in_child=_new_prefix)


def batch_token() -> str:
    """A token that marks one batch (see ``Batch.token``): unique across processes
    (a random 64-bit prefix drawn per process) and within one (a counter)."""
    return f"{_token_prefix}{next(_token_counter):x}"


@dataclass
class RunUpdate:
    """Absolute new values for a run's row (absolute so a retried batch is idempotent)."""

    step_count: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None
    active_seconds: float | None = None
    usage_simulated: bool | None = None  # set once a scripted model answered
    status: str | None = None
    available_at: float | None = None
    result: Any = _UNSET
    error: Any = _UNSET
    handover_reason: Any = _UNSET


@dataclass
class NewEvent:
    """An audit event to append in the same transaction as the batch."""

    type: str
    actor: str
    data: Any = None


@dataclass
class Batch:
    """Everything one step decides, committed atomically and fenced by lease epoch."""

    run_id: str
    epoch: int
    owner: str
    steps: list[Step] = field(default_factory=list)
    run: RunUpdate | None = None
    effects: list[Effect] = field(default_factory=list)
    outbox: list[OutboxItem] = field(default_factory=list)
    approvals: list[Approval] = field(default_factory=list)
    events: list[NewEvent] = field(default_factory=list)
    # Compensation began: the run's undelivered outbox rows are dropped, not delivered.
    drop_outbox: bool = False
    # Written with the fence: a commit retried after a lost reply (an ambiguous COMMIT)
    # reads it back to learn whether the first attempt committed.
    token: str = field(default_factory=batch_token)
    # Sent again by its caller after a store error: the store first looks for its token,
    # exactly as after a lost reply, so a batch that did commit is never applied twice.
    resent: bool = field(default=False, compare=False)
    # What the batch writes, encoded once when the batch is checked (validate_batch)
    # and reused when it is applied (queries.journal.EncodedBatch).
    encoded: Any = field(default=None, repr=False, compare=False)
    # Set by the store when the batch commits: the run's pending cancel request, read by
    # the fence in the same statement (no extra round trip), so the writer learns of a
    # cancel at its next step boundary rather than at its next heartbeat.
    cancel_requested: str | None = field(default=None, compare=False)


@dataclass
class NewRun:
    """What a caller submits."""

    kind: str
    name: str
    version: str
    input: Any
    tenant_id: str = "default"
    user_id: str | None = None
    available_at: float | None = None
    # Identifies this submit: a submit retried (after a lost reply, or by the caller with
    # the same id) returns the run the first attempt created instead of a second run.
    # The store generates one when the caller gives none.
    request_id: str | None = None


class AlreadyDecided(StoreError):
    """Another decision of this approval won (``approval`` holds the winner's)."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(
            f"approval {approval.id} was already decided by {approval.decided_by}: "
            f"{approval.decision}"
        )
        self.approval = approval


class UnstorableValue(StoreError):
    """A value no database column can hold faithfully (NaN or an infinity where a time,
    a lease or an amount goes, JSON that cannot be encoded, an integer past 64 bits).
    Refused before anything is written: stored, it would park a run forever, pin a
    lease that never expires, or fail the group it was committed with."""


class UnstorableBatch(UnstorableValue):
    """A batch holds a value the database cannot store; it fails alone, never its group."""


class KeyHeld(Exception):
    """A batch's unique key is held by another run: the batch is refused, nothing written."""


class EffectClaimed(KeyHeld):
    """An effect key is already claimed by another run or step."""

    def __init__(self, effect: Effect) -> None:
        super().__init__(f"effect {effect.key} already claimed by {effect.run_id}:{effect.step_no}")
        self.effect = effect


class OutboxKeyTaken(KeyHeld):
    """An outbox key is already held by another run's row.

    Outbox keys are unique across runs: a tool's ``outbox_key`` that leaves out
    the run (``ctx.run_id`` or ``ctx.idempotency_key``) makes a later run's row
    collide with an earlier one's. The row is refused, never dropped in silence.
    """

    def __init__(self, key: str, run_id: str, step_no: int) -> None:
        super().__init__(
            f"outbox key {key!r} is already held by run {run_id} (step {step_no}); "
            "make the tool's outbox_key unique per run (include ctx.idempotency_key)"
        )
        self.key, self.run_id, self.step_no = key, run_id, step_no
