"""``GET /v1/runs/{id}/events``: server-sent events, always resumable, or JSON pages.

Each event's ``id`` is its per-run ``seq`` (gapless, committed in order with the journal
entry it describes), so ``Last-Event-ID: N`` or ``?after=N`` resumes exactly after N.
A client that reconnects after the end gets the terminal event again. ``retry:`` and
heartbeat comments keep proxies open. A client that disconnects never cancels the run:
the stream only reads.

A tenant's events are followed the same way (:func:`follow_tenant`, the console's live
runs list): woken by the same hub, read in pages after a position that only grows, by
their audit chain position (gapless per tenant, in sealing order), so a follower that
resumes after position N misses nothing of the tenant's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from agentledger.records import RunStatus
from agentledger.service import _deltas as deltas
from agentledger.service._auth import Caller
from agentledger.service._deps import run_or_404
from agentledger.service._problems import PROBLEM_SCHEMA, Problem
from agentledger.service._queries import events as service_events
from agentledger.service._views import TERMINAL_EVENTS

router = APIRouter(prefix="/v1/runs", tags=["events"])
_PAGE = 500


def _resume_point(request: Request, after: int | None) -> int:
    header = request.headers.get("last-event-id")
    if header is not None and header.strip():
        try:
            value = int(header.strip())
        except ValueError:
            raise Problem("bad-request", "Last-Event-ID must be an event id (an integer)") from None
        if value < 0 or value > 2**62:
            raise Problem("bad-request", "Last-Event-ID out of range")
        return value
    return after or 0


def _sse(event: dict[str, Any]) -> str:
    data = json.dumps({k: event[k] for k in ("seq", "type", "actor", "at", "data")}, default=str)
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {data}\n\n"


@router.get(
    "/{run_id}/events",
    responses={
        200: {"content": {"text/event-stream": {}, "application/json": {}}},
        **{code: PROBLEM_SCHEMA for code in (400, 401, 404, 422)},
    },
)
async def run_events(
    run_id: str,
    request: Request,
    principal: Caller,
    after: int | None = Query(None, ge=0, le=2**62, description="Resume after this event id"),
    format: Literal["sse", "json"] = Query("sse"),
    limit: int = Query(100, ge=1, le=1000, description="Page size of format=json"),
) -> Any:
    """The run's events; ``format=json`` pages them for pollers."""
    start = _resume_point(request, after)
    row = await run_or_404(request, run_id, principal.tenant_id)
    store = request.app.state.store
    if format == "json":
        events = await store.read(service_events.run_events, run_id, start, limit)
        last = events[-1]["seq"] if events else start
        done = row["run"].terminal and last >= row["event_seq"]
        return {"run_id": run_id, "events": events, "next_after": last, "end": done}
    return StreamingResponse(
        _stream(request, run_id, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(request: Request, run_id: str, after: int) -> AsyncIterator[str]:
    state = request.app.state
    store = state.store
    settings = state.settings
    yield f"retry: {settings.sse_retry_ms}\n\n"
    last = after
    sent_terminal = False
    # Model deltas (ephemeral, no id) go out between journaled events: service/_deltas.py.
    async with state.hub.watch(run_id) as changed, deltas.follow(state, run_id) as feed:
        while True:
            changed.clear()
            head = state.hub.head(run_id)  # what woke us (see service/_hub.py)
            if head is None:
                heads = await store.read(service_events.event_heads, [run_id])
                head = heads.get(run_id, (0, RunStatus.QUEUED))
            head_seq, status = head
            while last < head_seq:
                page = await store.read(service_events.run_events, run_id, last, _PAGE)
                if not page:
                    break
                for event in page:
                    yield _sse(event)
                    last = event["seq"]
                    sent_terminal = sent_terminal or event["type"] in TERMINAL_EVENTS
            if status in RunStatus.TERMINAL and last >= head_seq:
                if not sent_terminal:  # a reconnect after the end: the terminal event again
                    final = await store.read(
                        service_events.last_event_of_types, run_id, TERMINAL_EVENTS
                    )
                    yield _sse(final or _synthetic_end(run_id, status, head_seq))
                return
            async for frame in feed.until(changed, settings.sse_heartbeat):
                yield frame


async def follow_tenant(
    request: Request, tenant_id: str, after: int
) -> AsyncIterator[tuple[int, list[dict[str, Any]]]]:
    """The tenant's events after chain position ``after`` as the sealer chains them:
    (the position reached, the page of events up to it). An empty page: nothing new for
    ``sse_heartbeat`` seconds (a stream's cue to say it is still there)."""
    state = request.app.state
    store = state.store
    heartbeat = state.settings.sse_heartbeat
    last = after
    async with state.hub.watch_tenant(tenant_id) as changed:
        while True:
            changed.clear()  # before the read: a change after it wakes the wait below
            head = state.hub.tenant_head(tenant_id)
            if head is None:
                heads = await store.read(service_events.tenant_heads, [tenant_id])
                head = heads.get(tenant_id, 0)
            while last < head:
                page = await store.read(service_events.tenant_events, tenant_id, last, _PAGE)
                if not page:
                    break
                last = page[-1]["chain_no"]
                yield last, page
            try:
                await asyncio.wait_for(changed.wait(), heartbeat)
            except TimeoutError:
                yield last, []


async def tenant_head(request: Request, tenant_id: str) -> int:
    """The tenant's chain position now (read from the store, not the hub)."""
    heads = await request.app.state.store.read(service_events.tenant_heads, [tenant_id])
    return int(heads.get(tenant_id, 0))


def _synthetic_end(run_id: str, status: str, seq: int) -> dict[str, Any]:
    return {"seq": seq, "type": f"run.{status}", "actor": "api", "at": None, "data": None}
