"""The outbox dispatcher: delivers side effects off the critical path.

A step that decides an email or a CRM update writes its outbox row in the same
transaction as its journal entry (see ``tool_step._enqueue``); the run goes on
without waiting. The dispatcher claims due rows under a short lease, calls the
tool with the row's own key, and retries with backoff up to the tool's
``outbox_attempts``; what exhausts them becomes a dead letter with its history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

from agentledger.app import App
from agentledger.engine.retries import as_tool_error
from agentledger.errors import BusinessError, InvalidArguments, RateLimited, Refused
from agentledger.records import OutboxItem
from agentledger.store.base import Store
from agentledger.tools.context import ToolContext

log = logging.getLogger(__name__)

BASE_DELAY = 1.0
MAX_DELAY = 300.0


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
        base_delay: float = BASE_DELAY,
    ) -> None:
        self.store = store
        self.app = app
        self.owner = owner
        self.batch = batch
        self.poll = poll
        self.lease_seconds = lease_seconds
        self.base_delay = base_delay

    async def run(self, stopping: asyncio.Event) -> None:
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

    async def deliver(self, item: OutboxItem) -> None:
        tool = self.app.tools.get(item.tool)
        now = time.time()
        item.attempts += 1
        if tool is None:
            item.status, item.last_error = "dead", f"no tool {item.tool!r} in this app"
            item.history.append({"at": now, "attempt": item.attempts, "error": item.last_error})
            await self.store.settle_outbox(item)
            return
        args = item.payload.get("args", {}) if isinstance(item.payload, dict) else {}
        ctx = ToolContext(
            run_id=item.run_id,
            step_no=item.step_no,
            idempotency_key=item.key,
            deadline=time.monotonic() + tool.timeout,
            tenant_id="default",
            user_id=None,
            attempt=item.attempts,
            resources=self.app.resources,
        )
        try:
            await asyncio.wait_for(tool.call(ctx, args), tool.timeout)
        except Exception as exc:
            error = as_tool_error(exc)
            if isinstance(exc, TimeoutError):
                error.error_class = "timeout"
            item.last_error = f"{error.error_class}: {error}"
            item.history.append({"at": now, "attempt": item.attempts, "error": item.last_error})
            final = isinstance(error, BusinessError | InvalidArguments | Refused)
            if final or item.attempts >= tool.outbox_attempts:
                item.status = "dead"
                log.warning(
                    "outbox %s dead after %d attempts: %s", item.key, item.attempts, item.last_error
                )
            else:
                delay = min(MAX_DELAY, self.base_delay * 2 ** (item.attempts - 1))
                delay *= random.uniform(0.75, 1.0)
                if isinstance(error, RateLimited) and error.retry_after:
                    delay = max(delay, error.retry_after)
                item.next_attempt_at = now + delay
            await self.store.settle_outbox(item)
            return
        item.status, item.last_error = "delivered", None
        item.history.append({"at": now, "attempt": item.attempts, "ok": True})
        await self.store.settle_outbox(item)
