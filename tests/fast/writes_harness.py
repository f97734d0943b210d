"""In-process harness for the write protocol: a real SQLite store in ``tmp_path``, an
App with small tools over in-memory providers that behave like real ones (keys,
stored responses, status lookups, apply-then-error faults), a claimed run and an
:class:`Execution` on a :class:`FakeClock`. Tests call ``run_tool_step``,
``drive_write`` and the :class:`OutboxDispatcher` directly: no subprocess, no sleep.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentledger import App, open_store
from agentledger._clock import FakeClock
from agentledger._outbox import OutboxDispatcher
from agentledger._workflow import Workflow
from agentledger.engine._execution import Execution
from agentledger.errors import (
    BusinessError,
    InProgress,
    InvalidArguments,
    NotSent,
    ProviderError,
    RateLimited,
    Refused,
    ToolTimeout,
)
from agentledger.records import OutboxItem, Run, Step
from agentledger.store._base import NewEvent, NewRun
from agentledger.store._sqlstore import Store
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import RetryPolicy, Tool, tool
from agentledger.tools._status import Status

# Faults a provider applies to its next calls, in order (then it answers normally):
#   ok, business, refused, invalid, 429 (retry_after via ``Fault.retry_after``),
#   not_sent (connection refused), 5xx_before / 5xx_after (answered 500 before / after
#   applying), timeout_before / timeout_after, in_progress (the first request of the
#   key is still running; ``Fault.apply`` makes it apply meanwhile), 5xx_saved (applied,
#   answered 500, and that 500 replayed for every later call with the key, as Stripe does).


@dataclass
class Fault:
    kind: str
    retry_after: float | None = None
    apply: bool = False


@dataclass
class Provider:
    """A provider with real semantics: a keyed one dedupes keys and replays the stored
    response; a key-less one applies every call anew. ``status`` looks a key up."""

    keyed: bool = True
    faults: list[Fault] = field(default_factory=list)
    status_faults: list[str] = field(default_factory=list)  # pending / error / ok
    applied: dict[str, Any] = field(default_factory=dict)  # key -> stored response
    effects: list[tuple[str, Any]] = field(default_factory=list)  # every effect applied
    calls: list[str] = field(default_factory=list)
    contexts: list[ToolContext] = field(default_factory=list)
    checks: int = 0
    saved_errors: set[str] = field(default_factory=set)  # keys whose stored answer is a 500
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def fail(self, *kinds: str | Fault) -> Provider:
        self.faults += [k if isinstance(k, Fault) else Fault(k) for k in kinds]
        return self

    def _apply(self, key: str, args: dict[str, Any]) -> Any:
        if self.keyed and key in self.applied:
            return self.applied[key]  # a replay: the first response, nothing applied again
        result = {"id": f"fx_{next(self._ids)}", **args}
        self.applied[key] = result
        self.effects.append((key, result))
        return result

    async def call(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        key = ctx.idempotency_key
        self.calls.append(key)
        self.contexts.append(ctx)
        if self.keyed and key in self.saved_errors:
            raise ProviderError("provider error 500: internal error (replayed)")
        fault = self.faults.pop(0) if self.faults else Fault("ok")
        kind = fault.kind
        if kind == "business":
            raise BusinessError("card declined")
        if kind == "refused":
            raise Refused("not allowed by the provider")
        if kind == "invalid":
            raise InvalidArguments("bad amount")
        if kind == "429":
            raise RateLimited("429 slow down", retry_after=fault.retry_after)
        if kind == "not_sent":
            raise NotSent("cannot connect: connection refused")
        if kind == "5xx_before":
            raise ProviderError("provider error 503: upstream unavailable")
        if kind == "timeout_before":
            raise ToolTimeout("no answer within 1.00 s")
        if kind == "in_progress":
            if fault.apply:
                self._apply(key, args)
            raise InProgress("request in progress (409): request_in_progress")
        result = self._apply(key, args)
        if kind == "5xx_after":
            raise ProviderError("provider error 500: internal error")
        if kind == "timeout_after":
            raise ToolTimeout("no answer within 1.00 s")
        if kind == "5xx_saved":  # Stripe: the 500 is saved and replayed for the key
            self.saved_errors.add(key)
            raise ProviderError("provider error 500: internal error")
        assert kind == "ok", kind
        return result

    async def status(self, ctx: ToolContext, args: dict[str, Any]) -> Status:
        self.checks += 1
        fault = self.status_faults.pop(0) if self.status_faults else "ok"
        if fault == "pending":
            return Status.pending()
        if fault == "error":
            raise ProviderError("status endpoint down")
        if fault == "failed":
            return Status.failed("card declined")
        key = ctx.idempotency_key
        return Status.succeeded(self.applied[key]) if key in self.applied else Status.not_found()


def make_tool(
    provider: Provider,
    name: str,
    *,
    idempotency: str = "provider",
    checked: bool = True,
    effect: str = "write",
    delivery: str = "direct",
    timeout: float = 5.0,
    retry: RetryPolicy | None = None,
    outbox_attempts: int = 5,
) -> Tool:
    """A tool ``name(item: str)`` over ``provider``."""

    async def fn(ctx: ToolContext, item: str = "x") -> Any:
        return await provider.call(ctx, {"item": item})

    fn.__name__ = name
    return tool(  # type: ignore[no-any-return]
        fn,
        name=name,
        effect=effect,  # type: ignore[arg-type]
        idempotency=idempotency,  # type: ignore[arg-type]
        status_check=provider.status if checked else None,
        timeout=timeout,
        retry=retry or RetryPolicy(base_delay=0.2),
        delivery=delivery,  # type: ignore[arg-type]
        outbox_attempts=outbox_attempts,
    )


class World:
    """One test's store, app, clock; runs claimed and executions built on demand."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "writes.db"
        self.store: Store = open_store(f"sqlite:///{self.path}")
        self.app = App("writes")
        self.clock = FakeClock()
        self.workflow = Workflow(name="wf", fn=_unused)
        self.app._add(self.workflow)
        self.owners = itertools.count(1)

    def add(self, *tools: Tool) -> None:
        for t in tools:
            self.app.add_tool(t)

    async def run(
        self, *, tenant_id: str = "acme", user_id: str | None = "u1", input: Any = None
    ) -> Run:
        """A new run, claimed (``running``) by a fresh owner."""
        await self.store.create_run(
            NewRun(
                kind="workflow",
                name="wf",
                version="1",
                input=input if input is not None else {"guest": "g1"},
                tenant_id=tenant_id,
                user_id=user_id,
            )
        )
        (run,) = await self.store.claim_runs(f"w{next(self.owners)}", ["wf@1"], 1, 3600)
        return run

    def execution(self, run: Run, *, park_threshold: float = 2.0) -> Execution:
        return Execution(
            self.store,
            self.workflow,
            run,
            run.lease_owner or "w",
            self.app.tools,
            self.app.resources,
            park_threshold=park_threshold,
            clock=self.clock,
        )

    async def new_execution(self, **run_fields: Any) -> Execution:
        exe = self.execution(await self.run(**run_fields))
        await exe.load()
        return exe

    async def reclaim(self, run_id: str) -> Execution:
        """The run taken over by another worker (its lease expired): a fresh execution."""
        with sqlite3.connect(self.path) as conn:
            conn.execute(
                "UPDATE runs SET lease_expires_at = 0, available_at = 0, status = "
                "CASE WHEN status = 'waiting' THEN 'queued' ELSE status END WHERE id = ?",
                (run_id,),
            )
        claimed = await self.store.claim_runs(f"w{next(self.owners)}", ["wf@1"], 10, 3600)
        (run,) = [r for r in claimed if r.id == run_id]
        exe = self.execution(run)
        await exe.load()
        return exe

    async def step(self, run_id: str, step_no: int) -> Step:
        (step,) = [s for s in await self.store.load_journal(run_id) if s.step_no == step_no]
        return step

    async def events(self, run_id: str) -> list[str]:
        return [e.type for e in await self.store.list_events(run_id)]

    # outbox ----------------------------------------------------------------------

    def dispatcher(self, **options: Any) -> OutboxDispatcher:
        return OutboxDispatcher(
            self.store, self.app, "dispatcher", clock=self.clock, base_delay=1.0, **options
        )

    async def outbox(self, key: str | None = None) -> list[OutboxItem]:
        rows = await self.store.list_outbox()
        return [r for r in rows if key is None or r.key == key]

    async def make_due(self) -> None:
        """Time passed for the outbox (the store judges due rows by the wall clock)."""
        with sqlite3.connect(self.path) as conn:
            conn.execute("UPDATE outbox SET next_attempt_at = 0 WHERE status = 'pending'")

    async def deliver_until_settled(self, limit: int = 20) -> OutboxItem:
        """Claim and deliver the (one) outbox row until it is no longer pending."""
        dispatcher = self.dispatcher()
        for _ in range(limit):
            await self.make_due()
            await dispatcher.drain()
            (row,) = await self.outbox()
            if row.status != "pending":
                return row
        raise AssertionError("outbox row still pending")


async def _unused(ctx: Any, input: Any) -> Any:  # the harness drives steps itself
    return None


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    await w.store.open()
    try:
        yield w
    finally:
        await w.store.close()


__all__ = ["Fault", "NewEvent", "Provider", "World", "make_tool", "world"]
