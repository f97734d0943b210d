"""The storage interface every backend implements.

The store is the one source of truth: runs, the step journal, effects, outbox,
approvals, events. The engine talks to it only through :class:`Store`; a backend
is a dialect of SQL plus a connection (see :mod:`agentledger.store.sqlstore`).

The one write the engine makes while a run executes is :meth:`Store.commit` of a
:class:`Batch`: every journal write, run counter, effect claim, outbox row,
approval and audit event that a step decides goes into one batch, and the batch
is *fenced* -- it commits only if the run's lease epoch is still the writer's.
Backends group many runs' batches into one durable transaction (group commit)
and resolve each caller only after that transaction is durable.
"""

from __future__ import annotations

import itertools
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agentledger.errors import StoreError
from agentledger.records import (
    Approval,
    Effect,
    Event,
    OutboxItem,
    Run,
    Step,
    WorkerInfo,
)

if TYPE_CHECKING:
    from agentledger.auditkey import AuditKey
    from agentledger.clock import Clock
    from agentledger.memory.queries import Fact
    from agentledger.observe.queries.resume import ResumePlan
    from agentledger.observe.queries.stuck import StuckRun
    from agentledger.retrieval.queries import ChunkHit, Document, NewChunk
    from agentledger.store.dialect import Dialect

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


class Store(ABC):
    """Async interface to the source of truth. One instance per process."""

    url: str

    # lifecycle -----------------------------------------------------------
    @abstractmethod
    async def open(self, *, migrate: bool = True) -> None:
        """Connect, create or migrate the schema (``migrate=False``: only check it)."""

    @abstractmethod
    async def close(self) -> None:
        """Flush pending writes and disconnect."""

    # runs ----------------------------------------------------------------
    @abstractmethod
    async def create_run(self, new: NewRun) -> Run: ...

    @abstractmethod
    async def get_run(self, run_id: str) -> Run | None: ...

    @abstractmethod
    async def list_runs(
        self, status: str | None = None, name: str | None = None, limit: int = 100
    ) -> list[Run]: ...

    @abstractmethod
    async def count_runs(self) -> dict[str, int]:
        """Runs by status."""

    @abstractmethod
    async def claim_runs(
        self, owner: str, targets: list[str], limit: int, lease_seconds: float
    ) -> list[Run]:
        """Claim up to ``limit`` runnable runs: new lease, ``lease_epoch + 1``."""

    @abstractmethod
    async def renew_leases(
        self, owner: str, leases: dict[str, int], lease_seconds: float
    ) -> set[str]:
        """Extend the leases held; return the run ids whose lease was lost."""

    @abstractmethod
    async def release_run(self, run_id: str, epoch: int, owner: str) -> bool:
        """Give a run back (graceful shutdown): queued again, lease cleared."""

    @abstractmethod
    async def expire_leases_of(self, owners: list[str]) -> int:
        """Expire at once the leases of owners known to be dead."""

    @abstractmethod
    async def lease_owners(self) -> list[str]:
        """Owners currently holding unexpired leases."""

    @abstractmethod
    async def cancel_run(self, run_id: str, reason: str, actor: str) -> Run:
        """Request the cancel of a run (see "Cancel" in docs/architecture.md): a queued run
        that never started is cancelled at once; any other non-terminal run gets
        ``cancel_requested`` and its worker honours it at the next step boundary."""

    @abstractmethod
    async def cancel_requests(self, run_ids: list[str]) -> dict[str, str]:
        """Which of ``run_ids`` have a cancel request (run id -> reason)."""

    # journal -------------------------------------------------------------
    @abstractmethod
    async def load_journal(self, run_id: str) -> list[Step]: ...

    @abstractmethod
    async def commit(self, batch: Batch) -> None:
        """Commit a fenced batch durably. Raises LeaseLost, EffectClaimed, or
        UnstorableBatch (this batch alone cannot be encoded; nothing was written)."""

    # tenant budgets of model calls ------------------------------------------
    async def set_tenant_budget(
        self,
        tenant_id: str,
        period_seconds: float,
        max_spend_usd: float | None = None,
        max_tokens: int | None = None,
        max_rps: float | None = None,
    ) -> None:
        """Create or replace a tenant's model spend/token limits per period and its model
        requests per second (a token bucket shared by every worker of the store)."""
        raise NotImplementedError

    async def reserve_tenant_usage(
        self, tenant_id: str, now: float, usd: float, tokens: int
    ) -> dict[str, Any] | None:
        """Reserve a model call's worst case against the tenant's period budget in one
        guarded update (``reserved`` False: over a limit, nothing taken; ``refused`` says
        which: ``budget`` or ``rate`` with ``retry_in`` seconds). None: no limits."""
        raise NotImplementedError

    async def settle_tenant_usage(
        self, tenant_id: str, period_start: float, usd: float, tokens: int
    ) -> None:
        """Move a period's usage by a settled call's difference (real minus reserved)."""
        raise NotImplementedError

    # effects, events, approvals, outbox -----------------------------------
    @abstractmethod
    async def get_effect(self, key: str) -> Effect | None: ...

    async def swap_effect(self, effect: Effect, expected: str | None) -> tuple[bool, Effect | None]:
        """Write ``effect`` outside any run's fence, only if the key's row has status
        ``expected`` (None: absent). Returns (written, current row). The outbox claims
        and settles effect keys of its deliveries with it."""
        raise NotImplementedError

    @abstractmethod
    async def list_events(self, run_id: str | None = None, after_id: int = 0) -> list[Event]: ...

    @abstractmethod
    async def append_event(self, run_id: str, type: str, actor: str, data: Any) -> None: ...

    @abstractmethod
    async def get_approvals(
        self, run_id: str | None = None, pending: bool = False
    ) -> list[Approval]: ...

    @abstractmethod
    async def decide_approval(
        self, approval_id: str, decision: str, decided_by: str, clock: Clock | None = None
    ) -> Approval:
        """Record a decision and re-queue the run. Exactly one decision wins: a later
        different one raises :class:`AlreadyDecided`; the same decider repeating the
        same decision (a retry) gets the recorded approval back. A person's decision
        (not ``system:...``) is recorded only while ``clock`` (the decider's; the real
        clock by default) reads before ``expires_at``, judged in the same statement that
        records it; else ``ApprovalExpired`` and nothing is recorded."""

    @abstractmethod
    async def claim_outbox(
        self, owner: str, limit: int, lease_seconds: float
    ) -> list[OutboxItem]: ...

    @abstractmethod
    async def settle_outbox(self, item: OutboxItem) -> bool:
        """Write back attempts, status, next_attempt_at, last_error, history, fenced by
        the claim ``item`` came from (``lease_owner``, ``claim_epoch``). False when the
        row was claimed again since (this claimer's lease expired): nothing written."""

    @abstractmethod
    async def list_outbox(
        self, status: str | None = None, run_id: str | None = None
    ) -> list[OutboxItem]:
        """Outbox rows, oldest first: all, or those in ``status`` and/or of ``run_id``."""

    # workers and versions --------------------------------------------------
    @abstractmethod
    async def register_worker(self, info: WorkerInfo, kinds: dict[str, str]) -> None: ...

    @abstractmethod
    async def heartbeat_worker(self, worker_id: str) -> None: ...

    @abstractmethod
    async def deregister_worker(self, worker_id: str) -> None: ...

    @abstractmethod
    async def list_workers(self, live_within: float | None = None) -> list[WorkerInfo]: ...

    @abstractmethod
    async def registrations(self) -> list[dict[str, Any]]:
        """Every (name, version, kind) a worker ever registered."""

    async def version_counts(self) -> list[dict[str, Any]]:
        """Runs per name, version, kind and status (``agentledger versions``)."""
        raise NotImplementedError

    async def open_runs(self, targets: list[str]) -> int:
        """How many runs of ``targets`` (``name@version``) are not terminal."""
        raise NotImplementedError

    async def mark_restored(self, source: str, actor: str) -> int:
        """After a restore from a backup: mark every non-terminal run restored, expire
        the backup's leases, forget its workers (store/queries/restore.py); how many runs."""
        raise NotImplementedError

    # memory and retrieval (see agentledger.memory, agentledger.retrieval) ------
    # Backends without them raise NotImplementedError.
    async def remember_fact(
        self,
        tenant_id: str,
        user_id: str,
        fact_key: str,
        fact: str,
        source_run: str | None = None,
        source_key: str | None = None,
    ) -> Fact:
        """Remember a fact about a user in a tenant (same key again: updated in place)."""
        raise NotImplementedError

    async def list_facts(
        self,
        tenant_id: str | None,
        user_id: str,
        created_before: float | None = None,
    ) -> list[Fact]:
        """A user's facts in a tenant (None: every tenant), newest first."""
        raise NotImplementedError

    async def fact_by_source(self, tenant_id: str, user_id: str, source_key: str) -> Fact | None:
        """The fact the step with idempotency key ``source_key`` wrote, if any."""
        raise NotImplementedError

    async def forget_facts(
        self,
        tenant_id: str,
        user_id: str,
        fact_key: str | None,
        actor: str,
        audit_key: AuditKey | None = None,
    ) -> int:
        """Delete a user's facts (one key or all), erase their copies (redactions signed
        under ``audit_key`` when given) and audit it; returns rows deleted."""
        raise NotImplementedError

    async def add_document(
        self,
        tenant_id: str,
        source: str,
        title: str,
        kind: str,
        sha256: str,
        chunks: list[NewChunk],
        actor: str,
    ) -> tuple[Document, bool]:
        """Index a document's chunks for full-text search; (document, changed)."""
        raise NotImplementedError

    async def list_documents(self, tenant_id: str | None = None) -> list[Document]:
        raise NotImplementedError

    async def remove_document(self, tenant_id: str, ref: str, actor: str) -> int:
        """Remove a tenant's document (by id or source); returns documents removed."""
        raise NotImplementedError

    async def search_chunks(self, tenant_id: str, query: str, k: int = 5) -> list[ChunkHit]:
        """Full-text search over one tenant's chunks, best first."""
        raise NotImplementedError

    # observability (see agentledger.observe) ------------------------------------
    # Backends without them raise NotImplementedError.
    async def observe_snapshot(self, *, live: bool = True, settled: bool = True) -> dict[str, Any]:
        """The store-derived metric values at this moment (observe/metrics.py renders
        them): the ``live`` part (unfinished runs, queue, outbox backlog; cheap at any
        volume) and the ``settled`` history (finished runs, audit counts)."""
        raise NotImplementedError

    async def run_stats(
        self, since: float | None, agent: str | None, tenant: str | None = None
    ) -> dict[str, Any]:
        """Runs created since ``since`` (of ``tenant``; None: every tenant's): by status,
        totals, duration percentiles and the failing-step distribution (observe/stats.py)."""
        raise NotImplementedError

    async def find_stuck(
        self,
        default_after: float,
        per_agent: dict[str, float],
        takeovers: int,
        live_within: float,
    ) -> list[StuckRun]:
        """Stuck runs now, judged on the database's clock (observe/stuck.py)."""
        raise NotImplementedError

    async def mark_stuck(self, run: StuckRun, actor: str) -> bool:
        """Report ``run``'s stuck episode once (a ``run.stuck`` event); False if done."""
        raise NotImplementedError

    async def plan_resume(self, run_id: str, from_step: int | None) -> ResumePlan:
        """What ``resume_run`` would do (a dry run)."""
        raise NotImplementedError

    async def resume_run(
        self,
        run_id: str,
        from_step: int | None,
        actor: str,
        reason: str | None = None,
    ) -> ResumePlan:
        """Queue a failed or needs_human run again from its failed step (or ``from_step``).

        Refused (:class:`ResumeRefused`) when it would call an unknown write again before
        it is settled, or delete an executed write or compensation."""
        raise NotImplementedError

    async def settle_step(
        self,
        run_id: str,
        step_no: int,
        applied: bool,
        result: Any,
        actor: str,
        reason: str,
    ) -> Step:
        """Record a person's decision on a write whose outcome is unknown: it happened
        (with ``result``) or it did not (it may be sent again with its key)."""
        raise NotImplementedError

    async def resume_candidates(self, status: str, agent: str | None, limit: int) -> list[str]:
        """Run ids in ``status`` (failed or needs_human), optionally of one agent."""
        raise NotImplementedError

    async def retry_outbox(self, key: str, actor: str) -> bool:
        """Redeliver a dead letter (dead -> pending); False when ``key`` is not dead."""
        raise NotImplementedError

    async def trace_context(self, run_id: str) -> str | None:
        """The run's stored trace context (W3C traceparent), if any."""
        raise NotImplementedError

    async def claim_trace_context(self, run_id: str, context: str) -> str | None:
        """Store the run's trace context unless it has one; return the stored one."""
        raise NotImplementedError

    # the service's queries ---------------------------------------------------
    async def transact(self, fn: Callable[[Dialect, Any], T], *, write: bool = True) -> T:
        """Run ``fn(dialect, conn)`` in ONE transaction of this store and return its result
        (the HTTP service's query modules, ``store/queries/service_*.py``, run this way).
        An :class:`~agentledger.errors.AgentLedgerError` raised by ``fn`` rolls back."""
        raise NotImplementedError
