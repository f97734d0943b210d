"""The outbox dispatcher: delivers side effects off the critical path.

A step that decides an email or a CRM update writes its outbox row in the same
transaction as its journal entry (see ``tool_step._enqueue``); the run goes on
without waiting. The dispatcher claims due rows under a short lease and delivers
each like any other write step (:func:`agentledger.engine._retries.run_attempts`):

* the call carries the row's own key and its run's tenant, user and input;
* retried by class within the tool's ``outbox_attempts``: 429 (honouring a capped
  Retry-After), a connection that never opened, 409 "request in progress";
  business / refused / invalid answers are final;
* an unknown outcome (timeout, 5xx, transport failure) is resolved like a direct
  write's: the tool's status check with the same key, or a same-key resend for a
  provider-keyed tool; for a tool guarded by the effects table the claim is taken
  before the call, and a claim found without a result is never called again: the
  row goes dead with "outcome unknown, check with the provider";
* every wait, and every further call, reschedules the row (``next_attempt_at``), so
  one delivery is at most a call and a status check (within its claim's lease); the
  retry state travels in the row's history, so the next delivery goes on where this
  one stopped;
* what exhausts its attempts, or cannot be settled, is a dead letter with its
  history. Only ``pending`` rows are delivered (a compensated step's rows are
  ``dropped`` by the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from agentledger import _envsettings as envsettings
from agentledger._app import App
from agentledger._clock import SYSTEM, Clock
from agentledger.engine import _inflight as inflight
from agentledger.engine._retries import (
    Attempts,
    RetryState,
    ask_status,
    call_with_timeout,
    run_attempts,
)
from agentledger.errors import ToolError
from agentledger.records import DeliveryStatus, Effect, EffectStatus, OutboxItem, Run
from agentledger.store._sqlstore import Store
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import Tool
from agentledger.tools._status import Status

log = logging.getLogger(__name__)

BASE_DELAY: float = envsettings.default("outbox_base_delay")
MAX_DELAY = 300.0
#: Overrides :data:`BASE_DELAY` for dispatchers built without one (a worker's): the
#: first backoff of a delivery, doubled per retry or pending status check, in seconds.
BASE_DELAY_ENV = "AGENTLEDGER_OUTBOX_BASE_DELAY"
UNKNOWN_OUTCOME = "outcome unknown, check with the provider"


class OutboxDispatcher:
    """Delivers pending outbox rows of the tools an app knows."""

    def __init__(
        self,
        store: Store,
        app: App,
        owner: str,
        *,
        batch: int = 20,
        poll: float = 0.25,
        lease_seconds: float = 60.0,
        base_delay: float | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.store = store
        self.app = app
        self.owner = owner
        self.batch = batch
        self.poll = poll
        self.lease_seconds = lease_seconds
        self.base_delay = base_delay if base_delay is not None else default_base_delay()
        self.clock = clock

    async def run(self, stopping: asyncio.Event) -> None:
        """Deliver due rows until ``stopping`` is set."""
        while not stopping.is_set():
            items = await self.store.claim_outbox(self.owner, self.batch, self.lease_seconds)
            if items:
                await asyncio.gather(*(self.deliver(item) for item in items))
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.poll)

    async def drain(self) -> int:
        """Deliver everything due now (for ``agentledger outbox``); return rows handled."""
        handled = 0
        while True:
            items = await self.store.claim_outbox(self.owner, self.batch, self.lease_seconds)
            if not items:
                return handled
            await asyncio.gather(*(self.deliver(item) for item in items))
            handled += len(items)

    async def deliver(self, item: OutboxItem) -> str | None:
        """Deliver one claimed row; return its status after (None: not touched)."""
        if item.status != DeliveryStatus.PENDING:
            # Delivered, dead or dropped (its step was compensated): never sent again.
            log.warning("outbox %s is %s, not pending: not delivered", item.key, item.status)
            return None
        async with inflight.try_exclusive(("outbox", item.key)) as mine:
            if not mine:  # another attempt of this row runs in this process right now
                return None
            return await self._deliver(item)

    async def _deliver(self, item: OutboxItem) -> str:
        tool = self.app.tools.get(item.tool)
        if tool is None:
            item.attempts += 1
            return await _settle_dead(self, item, f"no tool {item.tool!r} in this app")
        run = await self.store.get_run(item.run_id)
        ops = Delivery(self, item, tool, run)
        # Go on where the last delivery stopped: checking an unknown outcome, or
        # calling again (a same-key resend is a call, not a check).
        checking = _last_entry(item).get("next", "check" if ops.state.maybe_applied else "call")
        checking = checking == "check"
        if tool.idempotency == "effects":
            effect = await self.store.get_effect(ops.effect_key)
            if effect is not None and effect.status == EffectStatus.DONE:
                return await ops.succeeded(effect.result, "effect_found")
            if effect is not None and effect.status == EffectStatus.CLAIMED:
                # A delivery called (or was about to) and never recorded the outcome.
                ops.state.maybe_applied, checking = True, True
            ops.claim_status = None if effect is None else effect.status
        return await run_attempts(ops, checking=checking)


def default_base_delay() -> float:
    """The outbox's first backoff: ``$AGENTLEDGER_OUTBOX_BASE_DELAY`` or 1 s."""
    return envsettings.current().outbox_base_delay


class Delivery(Attempts[str]):
    """The attempts of one outbox row: a write step whose journal is the row."""

    def __init__(
        self, dispatcher: OutboxDispatcher, item: OutboxItem, tool: Tool, run: Run | None
    ) -> None:
        self.d, self.item, self.tool, self.run = dispatcher, item, tool, run
        self.args: dict[str, Any] = (
            item.payload.get("args", {}) if isinstance(item.payload, dict) else {}
        )
        retries = max(0, tool.outbox_attempts - 1)
        # The outbox's own retry policy: outbox_attempts calls in all, slow backoff.
        self.policy = dataclasses.replace(
            tool.retry,
            rate_limited=retries,
            provider_error=retries,
            in_progress=retries,
            timeout=retries,
            base_delay=dispatcher.base_delay,
            max_delay=MAX_DELAY,
        )
        self.state = _last_state(item)
        self.write = tool.writes
        self.checkable = tool.status_check is not None
        self.keyed = tool.idempotency == "provider"
        self.max_calls = tool.outbox_attempts
        self.inline_retries = False
        self.effect_key = item.key
        if tool.effect_key is not None:
            self.effect_key = tool.effect_key(self.args, self._context())
        self.claim_status: str | None = None  # the effect row's status before our claim
        self.holding = False  # we hold the effects-table claim for the next call

    def _context(self) -> ToolContext:
        run = self.run
        return ToolContext(
            run_id=self.item.run_id,
            step_no=self.item.step_no,
            idempotency_key=self.item.key,
            deadline=self.d.clock.monotonic() + self.tool.timeout,
            tenant_id=run.tenant_id if run is not None else "default",
            user_id=run.user_id if run is not None else None,
            attempt=max(1, self.state.attempts),
            run_input=run.input if run is not None else None,
            resources=self.d.app.resources,
            clock=self.d.clock,
        )

    # the attempt ---------------------------------------------------------------

    async def before_call(self) -> bool:
        if self.tool.idempotency != "effects" or self.holding:
            return True
        claim = Effect(
            key=self.effect_key,
            run_id=self.item.run_id,
            step_no=self.item.step_no,
            status=EffectStatus.CLAIMED,
            result={"outbox": self.item.key, "attempt": self.state.attempts + 1},
        )
        written, _ = await self.d.store.swap_effect(claim, self.claim_status)
        self.holding = written
        return written

    async def call(self) -> Any:
        self.item.attempts = self.state.attempts
        ctx = self._context()
        return await call_with_timeout(lambda: self.tool.call(ctx, self.args), self.tool.timeout)

    async def check(self) -> Status:
        return await ask_status(self.tool, self._context(), self.args, self.state.history)

    # outcomes --------------------------------------------------------------------

    async def unknown(self, error: ToolError) -> None:
        self._note(error=f"{error.error_class}: {error}", unknown=True)

    async def succeeded(self, result: Any, how: str) -> str:
        await self._settle_effect("done", result)
        self.state.maybe_applied = False
        self.item.status, self.item.last_error = DeliveryStatus.DELIVERED, None
        self._note(ok=True, how=how)
        await self.d.store.settle_outbox(self.item)
        return DeliveryStatus.DELIVERED

    async def failed(self, error: ToolError) -> str:
        await self._settle_effect("failed")
        return await _settle_dead(self.d, self.item, f"{error.error_class}: {error}", self)

    async def give_up(self, why: str) -> str:
        # The effects claim (if any) stays: it is the record that a call may have happened.
        return await _settle_dead(self.d, self.item, f"{UNKNOWN_OUTCOME} ({why})", self)

    async def wait(self, delay: float, error: ToolError, *, checking: bool) -> str:
        if not checking and not self.state.maybe_applied:
            await self._settle_effect("failed")  # released: the next delivery claims again
        self.item.next_attempt_at = self.d.clock.now() + delay
        self.item.last_error = f"{error.error_class}: {error}"
        self._note(
            error=self.item.last_error,
            retry_in=round(delay, 3),
            next="check" if checking else "call",
        )
        await self.d.store.settle_outbox(self.item)
        return DeliveryStatus.PENDING

    async def _settle_effect(self, status: str, result: Any = None) -> None:
        held = (
            self.holding or self.claim_status == EffectStatus.CLAIMED
        )  # ours, or an earlier delivery's
        if self.tool.idempotency != "effects" or not held:
            return
        effect = Effect(
            key=self.effect_key,
            run_id=self.item.run_id,
            step_no=self.item.step_no,
            status=status,
            result=result,
        )
        await self.d.store.swap_effect(effect, "claimed")
        self.holding = False
        self.claim_status = status

    def _note(self, **entry: Any) -> None:
        """One history entry, carrying the retry state the next delivery goes on from."""
        self.item.attempts = self.state.attempts
        self.item.history.append(
            {
                "at": self.d.clock.now(),
                "attempt": self.state.attempts,
                **entry,
                "retry": self.state.to_dict(),
            }
        )


def _last_entry(item: OutboxItem) -> dict[str, Any]:
    """The last history entry written by a delivery (with its retry state), or {}."""
    for entry in reversed(item.history):
        if isinstance(entry, dict) and isinstance(entry.get("retry"), dict):
            return entry
    return {}


def _last_state(item: OutboxItem) -> RetryState:
    entry = _last_entry(item)
    if entry:
        return RetryState.from_dict(entry["retry"])
    return RetryState(attempts=item.attempts)


async def _settle_dead(
    d: OutboxDispatcher, item: OutboxItem, reason: str, ops: Delivery | None = None
) -> str:
    item.status, item.last_error = DeliveryStatus.DEAD, reason
    if ops is not None:
        ops._note(error=reason, dead=True)
    else:
        item.history.append({"at": d.clock.now(), "attempt": item.attempts, "error": reason})
    log.warning("outbox %s dead after %d attempts: %s", item.key, item.attempts, reason)
    await d.store.settle_outbox(item)
    return DeliveryStatus.DEAD


__all__ = ["UNKNOWN_OUTCOME", "Delivery", "OutboxDispatcher"]
