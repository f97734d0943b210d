"""``GET /metrics`` (Prometheus text) and ``GET /v1/stats`` (the five numbers).

Both are computed from the store at request time, so every ``serve`` process and every
worker report the same figures. ``/metrics`` is deployment-wide (counts by agent, version
and tenant), so on the API port it needs a key with the ``deployment`` role; Prometheus
scrapes it without a key from ``serve --metrics-port``, a port of its own for the
internal network. ``/v1/stats`` needs the admin role and counts the caller's tenant;
a ``deployment`` key reads every tenant's, or one's with ``?tenant=``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response

from agentledger._extras import hint, missing
from agentledger.observe._stats import parse_since, stats
from agentledger.service._auth import ADMIN, DEPLOYMENT, Caller, require
from agentledger.service._problems import PROBLEM_SCHEMA, Problem

router = APIRouter(tags=["observe"])
ERRORS: dict[int | str, dict[str, Any]] = {code: PROBLEM_SCHEMA for code in (400, 401, 403)}


@router.get("/metrics", response_class=Response)
async def metrics(request: Request, principal: Caller) -> Response:
    """Prometheus text format: runs by state, queue depth and wait, outbox, stuck runs...
    (a ``deployment`` key; ``serve --metrics-port`` serves it without one)."""
    require(principal, DEPLOYMENT, action="reading deployment-wide metrics")
    if missing("metrics") is not None:
        raise Problem("not-found", hint("metrics", "serving /metrics"))
    from agentledger.observe._metrics import CONTENT_TYPE, render_metrics

    text = await render_metrics(request.app.state.store)
    return Response(content=text, media_type=CONTENT_TYPE)


@router.get("/v1/stats", responses=ERRORS)
async def five_numbers(
    request: Request,
    principal: Caller,
    since: str = Query("7d", max_length=20, description="7d, 12h, 30m, or all"),
    agent: str | None = Query(None, max_length=200),
    tenant: str | None = Query(None, max_length=200, description="deployment keys only"),
    version: str | None = Query(None, max_length=200, description="one version of the agent"),
    bucket: str | None = Query(
        None, pattern="^day$", description="day: also per agent, version and UTC day"
    ),
) -> dict[str, Any]:
    """Completion rate, p50/p95 duration, cost per run, failing steps (by step and
    class, with their cost), stuck runs of the caller's tenant (admin); of every
    tenant, or ``tenant``, with a deployment key. ``bucket=day`` adds ``series``: the
    numbers per agent, version and day."""
    if DEPLOYMENT in principal.roles:
        scope = tenant
    else:
        require(principal, ADMIN, action="reading the tenant's statistics")
        if tenant is not None and tenant != principal.tenant_id:
            raise Problem("forbidden", "?tenant= needs a key with the deployment role")
        scope = principal.tenant_id
    try:
        window = parse_since(since)
    except ValueError as exc:
        raise Problem("bad-request", str(exc)) from None
    found = await stats(
        request.app.state.store, window, agent, tenant=scope, version=version, bucket=bucket
    )
    return found.to_dict()
