"""``/ui/numbers``: the five numbers (completion rate, p50/p95 duration, cost per run,
failing steps by class with their cost, stuck runs) for the tenant, read through the
API's own ``/v1/stats`` handler (its role rule: admin); the same per agent and version,
and per day as charts; and the runs per day."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from agentledger.observe._queries import stats as observe_stats
from agentledger.observe._stats import parse_since, with_rates
from agentledger.service._console import charts, render
from agentledger.service._console.errors import PageError
from agentledger.service._console.signin import signed_in
from agentledger.service._problems import Problem
from agentledger.service._queries import console as queries
from agentledger.service._routers import observe as api

router = APIRouter(prefix="/ui/numbers", include_in_schema=False)
WINDOWS = ("24h", "7d", "30d", "all")
_MAX_TARGETS = 50  # agents and versions listed at most (the most runs first)
_MAX_DAYS = 60  # days drawn at most (the latest)


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f} %"


@router.get("")
async def numbers_page(request: Request, since: str = "7d") -> HTMLResponse:
    session = await signed_in(request)
    if since not in WINDOWS:
        since = "7d"
    p = session.principal
    try:
        overall = await api.five_numbers(request, p, since, None, None, None, None)
    except Problem as exc:
        raise PageError(exc.status, exc.title, f"{exc.detail}.") from None
    window = parse_since(since)
    start = None if window is None else time.time() - window
    store = request.app.state.store
    groups = await store.read(observe_stats.by_target, start, None, p.tenant_id, None, False)
    stuck: dict[tuple[str, str], int] = {}
    for s in overall["stuck"]:
        stuck[(s["name"], s["version"])] = stuck.get((s["name"], s["version"]), 0) + 1
    targets = sorted((with_rates(g) for g in groups), key=lambda g: (-g["runs"], g["agent"]))
    for g in targets:
        g["stuck_runs"] = stuck.get((g["agent"], g["version"]), 0)
    # Per day, the counts only: percentiles per agent, version and day would sort the
    # window's runs once more (``/v1/stats?bucket=day`` has them).
    daily = await store.read(observe_stats.by_target, start, None, p.tenant_id, None, True, False)
    series = [with_rates(g) for g in daily]
    drawn = [
        charts.line_chart(series, "completion_rate", "Completion rate per day", _rate),
        charts.line_chart(series, "cost_per_run_usd", "Cost per run per day", render.money),
    ]
    most = max(overall["by_status"].values(), default=0)
    rows = await store.read(queries.daily, p.tenant_id, start, None)
    return render.page(
        request, "numbers.html", title="Numbers", since=since, windows=WINDOWS,
        n=overall, targets=targets[:_MAX_TARGETS], more_targets=len(targets) > _MAX_TARGETS,
        charts=[c for c in drawn if c is not None], most=most, days=days_of(rows),
    )  # fmt: skip


_BAD = ("failed", "needs_human", "expired")


def days_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per UTC day (the last ``_MAX_DAYS`` with runs): runs completed, failed or handed
    over, the rest, and their cost; with each bar's place in a 1000-wide drawing."""
    by_day: dict[int, dict[str, Any]] = {}
    for r in rows:
        d = by_day.setdefault(r["day"], {"day": r["day"], "completed": 0, "bad": 0,
                                         "other": 0, "cost_usd": 0.0})  # fmt: skip
        status = r["status"]
        kind = "completed" if status == "completed" else "bad" if status in _BAD else "other"
        d[kind] += r["runs"]
        d["cost_usd"] += r["cost_usd"]
    days = [by_day[k] for k in sorted(by_day)][-_MAX_DAYS:]
    top = max((d["completed"] + d["bad"] + d["other"] for d in days), default=0)
    width = 1000 / max(len(days), 1)
    for i, d in enumerate(days):
        d["date"] = dt.datetime.fromtimestamp(d["day"] * 86400, tz=dt.UTC).strftime("%Y-%m-%d")
        d["total"] = d["completed"] + d["bad"] + d["other"]
        d["x"], d["w"] = round(i * width + 1, 1), round(max(width - 2, 1), 1)
        y = 200.0
        for kind in ("completed", "bad", "other"):
            h = 200 * d[kind] / top if top else 0
            y -= h
            d[f"{kind}_y"], d[f"{kind}_h"] = round(y, 1), round(h, 1)
    return days
