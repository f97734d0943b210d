"""``GET /metrics`` (Prometheus text) and ``GET /v1/stats`` (the five numbers).

Both are computed from the store at request time, so every ``serve`` process and every
worker report the same figures. ``/metrics`` is deployment-wide and carries no run data
beyond counts by agent, version and tenant: serve it on the internal network only (a
load balancer rule), as is usual for Prometheus endpoints. ``/v1/stats`` needs the admin
role and is deployment-wide too.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response

from agentledger.observe.metrics import CONTENT_TYPE, render_metrics
from agentledger.observe.stats import parse_since, stats
from agentledger.service.auth import ADMIN, Caller, require
from agentledger.service.problems import PROBLEM_SCHEMA, Problem

router = APIRouter(tags=["observe"])
ERRORS: dict[int | str, dict[str, Any]] = {code: PROBLEM_SCHEMA for code in (400, 401, 403)}


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format: runs by state, queue depth and wait, outbox, stuck runs..."""
    text = await render_metrics(request.app.state.store)
    return Response(content=text, media_type=CONTENT_TYPE)


@router.get("/v1/stats", responses=ERRORS)
async def five_numbers(
    request: Request,
    principal: Caller,
    since: str = Query("7d", max_length=20, description="7d, 12h, 30m, or all"),
    agent: str | None = Query(None, max_length=200),
) -> dict[str, Any]:
    """Completion rate, p50/p95 duration, cost per run, failing steps, stuck runs (admin)."""
    require(principal, ADMIN, action="reading deployment statistics")
    try:
        window = parse_since(since)
    except ValueError as exc:
        raise Problem("bad-request", str(exc)) from None
    return (await stats(request.app.state.store, window, agent)).to_dict()
