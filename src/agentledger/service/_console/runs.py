"""``/ui/runs``: the runs list (filters in the URL, paged on the server, live) and a
run's page (its story, followed live; cancel for operators).

The live list follows the tenant's event stream (``routers/events.follow_tenant``: the
hub wakes it when the tenant's audit chain grows) and reads its page again only when
an event could change it: an event of a run the page shows, or of a run that matches
the page's filter now and falls within it (``queries.runs_matching``, by the runs'
primary key). Events close together are one read (``LIVE_DEBOUNCE``). The stream sends
the page's rows itself, so a change costs one read; each frame's id is the tenant's
chain position the page reflects, so a reconnect (``Last-Event-ID``) gets the rows
again only when something happened meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from agentledger.service._auth import ADMIN, OPERATOR
from agentledger.service._console import render, sessions, story
from agentledger.service._console.errors import PageError, not_found
from agentledger.service._console.signin import checked_form, signed_in
from agentledger.service._cursors import make_cursor, parse_cursor
from agentledger.service._problems import Problem
from agentledger.service._queries import console as queries
from agentledger.service._routers import events as events_router
from agentledger.service._routers import runs as runs_router
from agentledger.service._routers.events import _resume_point
from agentledger.service._views import approval_view
from agentledger.store._queries import service_runs

router = APIRouter(prefix="/ui/runs", include_in_schema=False)
PAGE = 50
_TEXT_FILTERS = ("agent", "version", "user", "error_class", "idempotency_key")
LIVE_DEBOUNCE = 0.25  # seconds the live list waits after a relevant event for more
_RECHECK = 1.0  # seconds between an open stream's looks at its session
_MATCH_CHUNK = 500  # run ids per runs_matching query


async def _while_signed_in(
    request: Request, frames: AsyncIterator[str], recheck: float = _RECHECK
) -> AsyncIterator[str]:
    """``frames`` for as long as the session that opened the stream lives: a sign-out,
    the session's expiry or its key's revocation ends an open stream too (a stream is
    read for hours; checking only when it opened would let it outlive the session).
    The session is looked at before a frame when ``recheck`` seconds passed since the
    last look (0: before every frame)."""
    checked = time.monotonic()
    async with contextlib.aclosing(frames):  # type: ignore[type-var]
        async for frame in frames:
            now = time.monotonic()
            if now - checked >= recheck:
                checked = now
                if await sessions.current(request, touch=False) is None:
                    return
            yield frame


def _number(params: dict[str, str], name: str, errors: list[str], *, integer: bool = False) -> Any:
    raw = params.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        errors.append(f"{name.replace('_', ' ')}: {raw!r} is not a number; it was left out")
        return None
    if not math.isfinite(value) or value < 0 or value > 1e12:
        errors.append(f"{name.replace('_', ' ')}: give a number from 0; it was left out")
        return None
    return value


def _time(params: dict[str, str], name: str, errors: list[str]) -> float | None:
    raw = params.get(name, "").strip()
    if not raw:
        return None
    try:
        stamp = dt.datetime.fromisoformat(raw)
    except ValueError:
        errors.append(f"{name.replace('_', ' ')}: {raw!r} is not a date and time; it was left out")
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)  # the page shows and takes UTC
    return stamp.timestamp()


def filters_of(
    request: Request, tenant_id: str
) -> tuple[queries.ConsoleFilter, dict[str, str], list[str]]:
    """The filter the URL's query names, the query's values as given (for the form and
    the links), and what was left out and why."""
    params = {k: v for k, v in request.query_params.items() if len(v) <= 200}
    errors: list[str] = []
    status = params.get("status") or None
    if status is not None and status not in queries.STATUSES:
        errors.append(f"status: {status!r} is not a status; it was left out")
        status = None
    cursor = None
    if params.get("cursor"):
        try:
            cursor = parse_cursor(params["cursor"])
        except Problem:
            errors.append("that page link is not one this console made; showing the first page")
    f = queries.ConsoleFilter(
        tenant_id=tenant_id,
        status=status,
        **{k: (params.get(k) or "").strip() or None for k in _TEXT_FILTERS},
        min_retries=_number(params, "min_retries", errors, integer=True),
        cost_min=_number(params, "cost_min", errors),
        cost_max=_number(params, "cost_max", errors),
        created_after=_time(params, "from", errors),
        created_before=_time(params, "to", errors),
        cursor=cursor,
        limit=PAGE,
    )
    return f, params, errors


def _page_context(found: list[dict[str, Any]], params: dict[str, str]) -> dict[str, Any]:
    nxt = None
    if len(found) == PAGE:
        last = found[-1]["run"]
        nxt = make_cursor(last.created_at, last.id)
    shown = {k: v for k, v in params.items() if k != "cursor"}
    return {"runs": found, "params": shown, "next_cursor": nxt, "cursor": params.get("cursor")}


@router.get("")
async def runs_page(request: Request) -> HTMLResponse:
    session = await signed_in(request)
    f, params, errors = filters_of(request, session.principal.tenant_id)
    # Read before the page: the live stream goes on from here, so whatever happens
    # between the two reads is judged by it, not missed.
    after = await events_router.tenant_head(request, session.principal.tenant_id)
    found = await request.app.state.store.read(queries.list_runs, f)
    return render.page(
        request, "runs.html", title="Runs", errors=errors, statuses=queries.STATUSES,
        after=after, **_page_context(found, params),
    )  # fmt: skip


def _rows_frame(found: list[dict[str, Any]], params: dict[str, str], mark: int) -> str:
    body = render.html("_rows.html", **_page_context(found, params))
    return f"id: {mark}\nevent: rows\ndata: {json.dumps({'html': body})}\n\n"


def _oldest(found: list[dict[str, Any]]) -> tuple[float, str] | None:
    """The oldest row of a full page: older runs cannot enter it."""
    if len(found) < PAGE:
        return None
    last = found[-1]["run"]
    return (last.created_at, last.id)


def _stream_start(request: Request, after: int | None) -> int:
    """Where a page's event stream resumes (``?after`` or ``Last-Event-ID``), or a 400
    page for a value that is not an event id."""
    if after is not None and not 0 <= after <= 2**62:
        raise PageError(400, "Bad request", "after must be an event id")
    try:
        return _resume_point(request, after)
    except Problem as exc:
        raise PageError(400, "Bad request", exc.detail) from None


@router.get("/live")
async def runs_live(request: Request, after: int | None = None) -> Response:
    """Server-sent ``rows`` events: the page these filters show, read again whenever an
    event of the tenant could change it (see the module's docstring); a ``position``
    event when there was nothing to send for a heartbeat."""
    session = await signed_in(request, touch=False)
    tenant_id = session.principal.tenant_id
    start = _stream_start(request, after)
    f, params, _ = filters_of(request, tenant_id)
    params.pop("after", None)  # the stream's own, not the page's
    store = request.app.state.store
    settings = request.app.state.settings

    async def could_change(batch: list[dict[str, Any]], covered: int, shown: set[str],
                           floor: tuple[float, str] | None) -> bool:  # fmt: skip
        ids = list({e["run_id"] for e in batch if e["chain_no"] > covered})
        if not ids:
            return False
        if shown.intersection(ids):
            return True
        for i in range(0, len(ids), _MATCH_CHUNK):
            if await store.read(queries.runs_matching, f, ids[i : i + _MATCH_CHUNK], floor):
                return True
        return False

    async def stream() -> AsyncIterator[str]:
        yield f"retry: {settings.sse_retry_ms}\n\n"
        covered = await events_router.tenant_head(request, tenant_id)
        found = await store.read(queries.list_runs, f)
        sent = time.monotonic()
        if start != covered:  # the page the browser shows may be older than this one
            yield _rows_frame(found, params, covered)
        mark = covered
        shown = {r["run"].id for r in found}
        floor = _oldest(found)
        async for last, batch in events_router.follow_tenant(request, tenant_id, covered):
            mark = max(mark, last)
            if batch and await could_change(batch, covered, shown, floor):
                await asyncio.sleep(LIVE_DEBOUNCE)  # the events around it: one read
                covered = await events_router.tenant_head(request, tenant_id)
                found = await store.read(queries.list_runs, f)
                shown, floor = {r["run"].id for r in found}, _oldest(found)
                mark = max(mark, covered)
                sent = time.monotonic()
                yield _rows_frame(found, params, mark)
            elif time.monotonic() - sent >= settings.sse_heartbeat:
                sent = time.monotonic()
                yield f"id: {mark}\nevent: position\ndata: {{}}\n\n"

    # Each frame is a page of the tenant's rows (or a rare heartbeat): the session is
    # looked at before every one, so none goes out after a sign-out.
    return StreamingResponse(
        _while_signed_in(request, stream(), recheck=0.0), media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )  # fmt: skip


async def _story(request: Request, run_id: str, tenant_id: str) -> dict[str, Any]:
    """Everything a run's page shows; 404 page for an unknown id or another tenant's."""
    store = request.app.state.store
    if len(run_id) > 200:
        raise not_found("such run")
    row = await store.read(service_runs.service_run, run_id, tenant_id)
    if row is None:
        raise not_found(f"run {run_id}")
    run = row["run"]
    told = await store.read(queries.run_story, run_id)
    now = time.time()
    lane = story.segments(run, told["events"], now)
    steps = story.step_views(request.app.state.agent_app, run, told["steps"], told["events"])
    span = story.scale(run, lane, steps, now)
    return {
        "run": run,
        "row": row,
        "pending": approval_view(row.get("pending_approval")),
        "lane": lane,
        "steps": steps,
        "span": span,
        "approvals": [approval_view(a) for a in told["approvals"]],
        "outbox": told["outbox"],
        "effects": told["effects"],
        "events": told["events"],
        "event_seq": row["event_seq"],
    }


def _may_resume(request: Request, run: Any) -> bool:
    p = request.state.console_session.principal
    return run.status in ("failed", "needs_human") and p.has(OPERATOR, ADMIN)


def _may_cancel(request: Request, run: Any) -> bool:
    p = request.state.console_session.principal
    return not run.terminal and (p.has(OPERATOR, ADMIN) or (run.user_id == p.user_id and p.acts))


@router.get("/{run_id}")
async def run_page(request: Request, run_id: str) -> HTMLResponse:
    session = await signed_in(request)
    told = await _story(request, run_id, session.principal.tenant_id)
    return render.page(
        request, "run.html", title=f"Run {run_id}", may_cancel=_may_cancel(request, told["run"]),
        may_resume=_may_resume(request, told["run"]), **told,
    )  # fmt: skip


@router.get("/{run_id}/story")
async def run_story(request: Request, run_id: str) -> HTMLResponse:
    """The story part of a run's page alone: what the page swaps in as events arrive."""
    session = await signed_in(request, touch=False)
    told = await _story(request, run_id, session.principal.tenant_id)
    body = render.html(
        "_story.html", session=session, may_cancel=_may_cancel(request, told["run"]),
        may_resume=_may_resume(request, told["run"]), **told,
    )  # fmt: skip
    return HTMLResponse(body, headers={"Cache-Control": "no-store"})


@router.get("/{run_id}/events")
async def run_events(request: Request, run_id: str, after: int | None = None) -> Response:
    """The run's events as the API streams them (the same code: resumable with
    ``Last-Event-ID``), for the signed-in session."""
    session = await signed_in(request, touch=False)
    start = _stream_start(request, after)
    if len(run_id) > 200:
        raise not_found("such run")
    row = await request.app.state.store.read(
        service_runs.service_run, run_id, session.principal.tenant_id
    )
    if row is None:
        raise not_found(f"run {run_id}")
    return StreamingResponse(
        _while_signed_in(request, events_router._stream(request, run_id, start)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/{run_id}/cancel")
async def cancel(request: Request, run_id: str) -> Response:
    """Cancel through the API's own handler (its role checks, its audit event), marked
    as coming from the console."""
    session, fields = await checked_form(request)
    reason = (fields.get("reason") or "").strip()[:900] or "cancelled from the console"
    request.state.via = "console"
    try:
        await runs_router.cancel_run(
            run_id, request, session.principal, runs_router.CancelRun(reason=reason)
        )
    except Problem as exc:
        if exc.status == 404:
            raise not_found(f"run {run_id}") from None
        raise PageError(exc.status, exc.title, exc.detail) from None
    return RedirectResponse(f"/ui/runs/{run_id}", status_code=303)
