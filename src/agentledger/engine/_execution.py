"""One claimed run in memory: its journal, counters, budget and fenced writes.

Every write goes through :meth:`Execution.record` or :meth:`Execution.finish`,
which build one fenced :class:`~agentledger.store._base.Batch`; a rejected fence
becomes :class:`~agentledger.engine._signals.Abandon`, so a worker that lost its
lease stops that run at its next write.

A write's plain success may be *held* (``record(..., hold=True)``): the run's next
journal write carries it in its own transaction, so a write step that follows a write
commits once (the outcome before it and its own ``started``) instead of twice. The
hold is exact for the unknown-outcome protocol: a ``started`` entry is always durable
before its call, and a held outcome lost in a crash leaves that ``started`` entry,
which resume settles by the status check or a same-key resend like any call whose
outcome was not journaled. A held outcome is committed before anything else of the
run runs: with the next journal write, or on its own when the next step runs code
before journaling (:meth:`Execution.durable`), or when the run's code waits on
anything else (the event loop's next turn), or when the execution ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentledger._agent import Agent
from agentledger._backoff import Backoff
from agentledger._canonical import NotJournalable, clean_text, journal_value
from agentledger._clock import SYSTEM, Clock
from agentledger._workflow import Workflow
from agentledger.engine._signals import Abandon, Cancelled, Handover, HandoverReason
from agentledger.errors import LeaseLost, StoreError, StoreUnavailable
from agentledger.records import Approval, Effect, OutboxItem, Run, RunStatus, Step, StepStatus
from agentledger.store._base import Batch, KeyHeld, NewEvent, RunUpdate
from agentledger.store._sqlstore import Store
from agentledger.tools._context import Principal
from agentledger.tools._contract import Tool

log = logging.getLogger(__name__)

STORE_RETRY_SECONDS = 10.0  # how long a journal write the store refused is retried


def step_key(run_id: str, step_no: int) -> str:
    """The deterministic idempotency key of step ``step_no`` of ``run_id``."""
    return f"{run_id}:{step_no}"


class Execution:
    """The state of one run while a worker holds its lease."""

    def __init__(
        self,
        store: Store,
        definition: Agent | Workflow,
        run: Run,
        owner: str,
        tools: dict[str, Tool],
        resources: dict[str, Any],
        *,
        stopping: asyncio.Event | None = None,
        park_threshold: float = 2.0,
        clock: Clock = SYSTEM,
        cancel_requests: Mapping[str, str] | None = None,
        store_retry_seconds: float = STORE_RETRY_SECONDS,
    ) -> None:
        self.store = store
        self.store_retry_seconds = store_retry_seconds
        self.definition = definition
        self.run = run
        self.owner = owner
        self.epoch = run.lease_epoch
        self.tools = tools
        self.resources = resources
        self.stopping = stopping or asyncio.Event()
        self.park_threshold = park_threshold
        self.clock = clock
        # Cancel requests the worker learned of since the claim (run id -> reason).
        self.cancel_requests: Mapping[str, str] = (
            cancel_requests if cancel_requests is not None else {}
        )  # the live map: kept by reference even while it is empty
        self._cancel_seen: str | None = None  # cancel-at-boundary: from the last write's fence
        # Who started the run, as every tool call of this execution is told (immutable).
        self.principal = Principal.of_run(run.tenant_id, run.user_id, run.principal)
        self.budget = definition.budget
        self.policy = definition.policy
        self.journal: dict[int, Step] = {}
        self.compensating = False
        # Input hashes the code asked with, by step number, written with the step's
        # first journal entry (the nondeterminism check compares them on replay).
        self._input_hashes: dict[int, str] = {}
        self.pending_events: list[NewEvent] = []  # audit events for the next journal write
        self.step_count = run.step_count
        self.tokens = run.tokens
        self.cost_usd = run.cost_usd
        self.usage_simulated = run.usage_simulated
        self._active_base = run.active_seconds
        self._segment_start = clock.monotonic()
        self._held: Batch | None = None  # a write's outcome the next write carries
        self._flushing: asyncio.Task[None] | None = None  # a held outcome on its own

    async def load(self) -> None:
        for step in await self.store.load_journal(self.run.id):
            self.journal[step.step_no] = step

    # time and budget --------------------------------------------------------

    def active_seconds(self) -> float:
        return self._active_base + (self.clock.monotonic() - self._segment_start)

    def time_left(self) -> float:
        """Active seconds left in the run's budget."""
        return self.budget.active_seconds - self.active_seconds()

    def prior(self, step_no: int, name: str, input_hash: str | None = None) -> Step | None:
        """The journal entry of ``step_no``, checked to be the step the code asks for.

        Replayed code must ask for its steps in the same order and with the same
        arguments; a different name, or a different ``input_hash`` (of the step's
        arguments), at the same number means the code changed under the run: a human
        looks. The hash given here is written with the step's first journal entry.
        """
        step = self.journal.get(step_no)
        if step is not None and step.name != name:
            raise Handover(
                HandoverReason.NONDETERMINISM,
                f"step {step_no} is {step.name!r} in the journal but the code asked for {name!r}",
            )
        if input_hash is not None:
            if step is not None and step.input_hash and step.input_hash != input_hash:
                raise Handover(
                    HandoverReason.NONDETERMINISM,
                    f"step {step_no} ({name!r}) was journaled with other arguments "
                    f"(input hash {step.input_hash}, now {input_hash})",
                )
            self._input_hashes[step_no] = input_hash
        return step

    def key(self, step_no: int) -> str:
        """The deterministic idempotency key of a step."""
        return step_key(self.run.id, step_no)

    def cancel_reason(self) -> str | None:
        """Why the run is to be cancelled, if a cancel was requested (at claim or since:
        read back by the fence of each journal write, or by the worker's heartbeat)."""
        return (
            self.cancel_requests.get(self.run.id) or self._cancel_seen or self.run.cancel_requested
        )

    def between_steps(self) -> None:
        """Checks made before a brand-new step: shutdown, cancel, then budgets.

        Only ever called before a step the journal does not have: a step in flight
        (started, unknown, retrying, waiting) is resolved first, so a budget or a
        cancel never leaves a write unchecked.
        """
        if self.stopping.is_set():
            raise Abandon("worker shutting down", release=True)
        cancel = self.cancel_reason()
        if cancel is not None:
            raise Cancelled(cancel)
        reason = self.budget.exceeded(
            self.step_count, self.active_seconds(), self.tokens, self.cost_usd
        )
        if reason is not None:
            raise Handover(HandoverReason.BUDGET, reason)

    async def before_step(self, *, carries: bool = False) -> None:
        """The boundary before a brand-new step: a held outcome is committed first (its
        fence reads back any cancel request), then :meth:`between_steps`. ``carries``:
        the step is a plain write whose ``started`` entry carries the held outcome
        instead (see :func:`carries_held`); a cancel that entry reads back is honoured
        before the call (``engine/_unknown.py``)."""
        if not carries:
            await self.durable()
        self.between_steps()

    # writes -------------------------------------------------------------------

    async def record(
        self,
        step: Step,
        *,
        effects: Sequence[Effect] = (),
        outbox: Sequence[OutboxItem] = (),
        approvals: Sequence[Approval] = (),
        events: Sequence[NewEvent] = (),
        park_until: float | None = None,
        drop_outbox: bool = False,
        hold: bool = False,
    ) -> None:
        """Journal a step (fenced) and commit it before anything else happens.

        ``hold``: the step is a write's plain success (no effect, outbox row, approval,
        park or event of its own; its tool can be status-checked or resent with the same
        key): it is not committed here but carried by the run's next write (see the
        module's docstring).

        ``park_until``: also set the run ``waiting`` until then (dropping the lease) in the
        same transaction, so a decision that lands right after it finds the run waiting.
        ``drop_outbox``: compensation begins; the run's undelivered outbox rows are dropped.

        The output is stored as the journal will return it on replay (its JSON round
        trip); an output JSON cannot carry fails the step with ``not_journalable``. The
        idempotency key and input hash of a step are fixed by its first journal entry.
        """
        previous = self.journal.get(step.step_no)
        _settle_values(step, previous, self._input_hashes.get(step.step_no))
        effects = [_journalable_effect(e) for e in effects]
        step_count = self.step_count + (0 if previous else 1)
        tokens = self.tokens + step.tokens - (previous.tokens if previous else 0)
        cost = self.cost_usd + step.cost_usd - (previous.cost_usd if previous else 0.0)
        step.lease_epoch = self.epoch
        simulated = not self.usage_simulated and _simulated_usage(step)
        batch = Batch(
            self.run.id,
            self.epoch,
            self.owner,
            steps=[step],
            run=RunUpdate(
                step_count=step_count,
                tokens=tokens,
                cost_usd=cost,
                active_seconds=self.active_seconds(),
                usage_simulated=True if simulated else None,
                status=RunStatus.WAITING if park_until is not None else None,
                available_at=park_until,
            ),
            effects=list(effects),
            outbox=list(outbox),
            approvals=list(approvals),
            events=list(events),
            drop_outbox=drop_outbox,
        )
        if hold and not (effects or outbox or approvals or events or drop_outbox):
            if park_until is None and previous is not None:
                self._hold(batch)
            else:
                await self._commit(batch)
        else:
            await self._commit(batch)
        self.journal[step.step_no] = step
        self.step_count, self.tokens, self.cost_usd = step_count, tokens, cost
        self.usage_simulated = self.usage_simulated or simulated

    async def finish(
        self,
        status: str,
        *,
        result: Any = None,
        error: str | None = None,
        handover_reason: str | None = None,
        available_at: float | None = None,
        events: Sequence[NewEvent] = (),
    ) -> None:
        """Move the run out of ``running`` (terminal or waiting) and drop the lease."""
        update = RunUpdate(
            step_count=self.step_count,
            tokens=self.tokens,
            cost_usd=self.cost_usd,
            active_seconds=self.active_seconds(),
            status=status,
            available_at=available_at,
        )
        if status in RunStatus.TERMINAL:
            update.result, update.error, update.handover_reason = result, error, handover_reason
        batch = Batch(self.run.id, self.epoch, self.owner, run=update, events=list(events))
        await self._commit(batch)

    async def event(self, type: str, data: Any) -> None:
        """An audit event on its own (fenced like any other write)."""
        await self._commit(
            Batch(self.run.id, self.epoch, self.owner, events=[NewEvent(type, self.owner, data)])
        )

    def _hold(self, batch: Batch) -> None:
        if self._held is not None:  # two holds in a row (parallel writes): one batch
            batch = _carried(self._held, batch)
        self._held = batch
        # The run's code waiting on anything but its next write commits the hold then.
        asyncio.get_running_loop().call_soon(self._flush_held)

    def _flush_held(self) -> None:
        if self._held is None or (self._flushing is not None and not self._flushing.done()):
            return  # nothing held, or a flush in progress (its end flushes what follows)
        batch, self._held = self._held, None
        self._flushing = asyncio.create_task(self._flush_after(self._flushing, batch))

    async def _flush_after(self, previous: asyncio.Task[None] | None, batch: Batch) -> None:
        """Commit a held outcome on its own, after the flush before it (whose failure is
        this one's too). An outcome held while that flush ran is flushed next: parallel
        writes that return while a sibling is still being called are all durable."""
        if previous is not None:
            await previous
        try:
            await self._send(batch)
        finally:
            if self._held is not None:
                asyncio.get_running_loop().call_soon(self._flush_held)

    async def durable(self) -> None:
        """Commit a held outcome now: the next step is about to run code (a read, a
        ``ctx.step`` function, server arguments) before its own journal write."""
        if self._held is not None or self._flushing is not None:
            await self._commit(None)

    async def settle_held(self) -> None:
        """At the end of an execution: commit what is still held (best effort: an
        outcome that cannot be committed now is settled by resume's status check)."""
        try:
            await self.durable()
        except Abandon as exc:
            log.info("run %s: a held outcome was not committed (%s)", self.run.id, exc.why)

    async def _commit(self, batch: Batch | None) -> None:
        """Commit ``batch`` with whatever is held (held outcomes first, in order)."""
        if self._flushing is not None:
            flushing, self._flushing = self._flushing, None
            await flushing  # its Abandon (lease lost, store error) is this write's too
        carried = None
        if self._held is not None:
            carried, self._held = self._held, None
            batch = carried if batch is None else _carried(carried, batch)
        if batch is None:
            return
        try:
            await self._send(batch)
        except KeyHeld:
            # Refused whole for a key another run holds (nothing written): the outcome
            # it carried still goes in, on its own, before the caller sees the refusal.
            if carried is not None and carried is not batch:
                await self._send(carried)
            raise

    async def _send(self, batch: Batch) -> None:
        known = self.cancel_reason()
        try:
            await self._commit_retrying(batch)
            self._cancel_seen = batch.cancel_requested or self._cancel_seen
        except LeaseLost as exc:
            raise Abandon(f"lease lost: {exc}") from None
        except StoreUnavailable as exc:
            # The store's host failed (disk full, I/O error, read-only, connection
            # lost), not the run: the worker gives the run back and reports the cause.
            # The cause is the worker's to log, once for all runs (a full disk fails all).
            log.info(
                "run %s: giving up its journal write after %g s of store errors",
                self.run.id,
                self.store_retry_seconds,
            )
            raise Abandon(f"store error: {exc}", release=True, error=exc) from None
        except StoreError as exc:
            # The store refused what this run wrote: leave it to be resumed (its lease
            # expires; a run that keeps failing so goes to a human after max_resumes)
            # rather than letting workflow code see the error.
            log.warning("run %s: journal write refused (%s); abandoning it", self.run.id, exc)
            raise Abandon(f"store error: {exc}") from None
        if batch.run is not None and batch.run.status is not None:
            _rest(self.run, batch.run)
            parked = batch.run.status == RunStatus.WAITING
            if parked and known is None and batch.cancel_requested is not None:
                await self._poke_cancel(batch.cancel_requested)

    async def _commit_retrying(self, batch: Batch) -> None:
        """Commit ``batch``; a store error that is not the run's is retried with backoff
        for ``store_retry_seconds``. A batch is sent again marked ``resent``, so the store
        first looks whether the failed attempt committed after all."""
        # Real time, not the run's clock: a test's fake clock must not stretch retries.
        deadline = time.monotonic() + self.store_retry_seconds
        backoff = None  # made by the first failure: most writes commit at once
        while True:
            try:
                await self.store.commit(batch)
                return
            except StoreUnavailable as exc:
                backoff = backoff or Backoff(first=0.05, cap=2.0)
                pause = backoff.next()
                if self.stopping.is_set() or time.monotonic() + pause > deadline:
                    raise
                log.debug("run %s: journal write failed (%s); retrying", self.run.id, exc)
                await asyncio.sleep(pause)
                batch.resent = True

    async def _poke_cancel(self, reason: str) -> None:
        """A cancel requested while the run was running only marked it; learned first
        from the fence of the write that parked it, it would wait out the park (a sleep,
        an approval's expiry). Requested again, the parked run is due at once. Only
        then: a run parking with a cancel it already knows (a compensation waiting out
        a backoff) keeps its backoff."""
        try:
            after = await self.store.cancel_run(self.run.id, reason, self.owner)
        except StoreError as exc:  # the park stands; the cancel is honoured when it ends
            log.warning("run %s: cancel not made due at once (%s)", self.run.id, exc)
            return
        # The park no longer stands as written: whoever holds the run (the worker's line
        # about it) must see it due now for its cancel, not waiting out the park.
        self.run.status, self.run.available_at = after.status, after.available_at
        self.run.cancel_requested = after.cancel_requested


def _rest(run: Run, update: RunUpdate) -> None:
    """Set on ``run`` what a committed write that moved it out of ``running`` wrote to
    its row: whoever holds the claimed run (the worker's line about it) knows where the
    execution left it without reading it back."""
    run.status = update.status or run.status  # always set: the caller checks it
    run.lease_owner = run.lease_expires_at = None
    run.available_at = update.available_at
    for name in ("step_count", "tokens", "cost_usd", "active_seconds"):
        value = getattr(update, name)
        if value is not None:
            setattr(run, name, value)
    run.usage_simulated = run.usage_simulated or bool(update.usage_simulated)
    if update.status in RunStatus.TERMINAL:  # what finish() writes of a terminal run
        run.result = update.result
        run.error, run.handover_reason = _text(update.error), _text(update.handover_reason)


def _text(value: str | None) -> str | None:
    return None if value is None else clean_text(value)  # as the store writes it


def carries_held(tool: Tool | None) -> bool:
    """Whether a call of ``tool`` journals ``started`` before it runs anything, with no
    effect claim, outbox row or server arguments: that entry may carry a held outcome."""
    return (
        tool is not None
        and tool.writes
        and tool.delivery != "outbox"
        and tool.idempotency != "effects"
        and not tool.server_args
    )


def _carried(held: Batch, batch: Batch) -> Batch:
    """``batch`` carrying a held outcome: the held journal entry (and its step event)
    first, then ``batch``'s own writes; the run's counters are ``batch``'s (absolute,
    and newer). An entry of the same step in both keeps only ``batch``'s."""
    mine = {s.step_no for s in batch.steps}
    batch.steps = [s for s in held.steps if s.step_no not in mine] + batch.steps
    batch.events = held.events + batch.events
    if batch.run is None:
        batch.run = held.run
    batch.encoded = None
    return batch


def _settle_values(step: Step, previous: Step | None, input_hash: str | None) -> None:
    """Make ``step`` exactly what replay will read back (see :meth:`Execution.record`)."""
    if previous is not None and previous.idempotency_key is not None:
        # Never recomputed: the provider knows the step by its first key.
        step.idempotency_key = previous.idempotency_key
    if previous is not None and previous.input_hash is not None:
        step.input_hash = previous.input_hash
    elif step.input_hash is None:
        step.input_hash = input_hash
    try:
        step.output = journal_value(step.output)
    except NotJournalable as exc:
        step.output = None
        if step.status == StepStatus.SUCCEEDED:
            step.status, step.error_class = StepStatus.FAILED, exc.error_class
            step.error = f"result of {step.name} cannot be journaled: {exc}"
    if step.error is not None:
        step.error = clean_text(step.error)


def _journalable_effect(effect: Effect) -> Effect:
    try:
        effect.result = journal_value(effect.result)
    except NotJournalable:
        effect.result = None
    return effect


def _simulated_usage(step: Step) -> bool:
    """Whether ``step`` is a model step a scripted (offline) model answered."""
    output = step.output if step.kind == "model" else None
    usage = output.get("usage") if isinstance(output, dict) else None
    return isinstance(usage, dict) and usage.get("simulated") is True
