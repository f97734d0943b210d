"""``/ui/numbers``: the five numbers (completion rate, p50/p95 duration, cost per run,
failing steps with their cost, stuck runs) for the tenant and per agent, read through
the API's own ``/v1/stats`` handler (its role rule: admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from agentledger.service._console import render
from agentledger.service._console.errors import PageError
from agentledger.service._console.signin import signed_in
from agentledger.service._problems import Problem
from agentledger.service._routers import observe as api

router = APIRouter(prefix="/ui/numbers", include_in_schema=False)
WINDOWS = ("24h", "7d", "30d", "all")
_MAX_AGENTS = 20  # per-agent rows read per page (each is one stats read)


@router.get("")
async def numbers_page(request: Request, since: str = "7d") -> HTMLResponse:
    session = await signed_in(request)
    if since not in WINDOWS:
        since = "7d"
    p = session.principal
    try:
        overall = await api.five_numbers(request, p, since, None, None)
    except Problem as exc:
        raise PageError(exc.status, exc.title, f"{exc.detail}.") from None
    names = sorted({t.split("@", 1)[0] for t in request.app.state.agent_app.targets()})
    per_agent: list[tuple[str, dict[str, Any]]] = []
    for name in names[:_MAX_AGENTS]:
        figures = await api.five_numbers(request, p, since, name, None)
        if figures["runs"]:
            per_agent.append((name, figures))
    most = max(overall["by_status"].values(), default=0)
    return render.page(
        request, "numbers.html", title="Numbers", since=since, windows=WINDOWS,
        n=overall, per_agent=per_agent, most=most,
    )  # fmt: skip
