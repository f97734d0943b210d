"""``/ui/numbers``: the five numbers (completion rate, p50/p95 duration, cost per run,
failing steps by class with their cost, stuck runs) of the tenant's runs created on the
last whole UTC days (admin, as ``/v1/stats``); the same per agent and version, and per
day as charts; and the runs per day. Read from the daily rollup (observe/_numbers.py), so
a view costs the rollup's rows in the window, not the window's runs."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from agentledger.observe._numbers import numbers
from agentledger.observe._stuck import StuckPolicy
from agentledger.service._auth import ADMIN, require
from agentledger.service._console import charts, render
from agentledger.service._console.errors import PageError
from agentledger.service._console.signin import signed_in
from agentledger.service._problems import Problem
from agentledger.store._queries.rollup import PRECISION

router = APIRouter(prefix="/ui/numbers", include_in_schema=False)
#: The windows offered, in whole UTC days (today included); None: every day.
WINDOWS: dict[str, int | None] = {"1d": 1, "7d": 7, "30d": 30, "all": None}
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
        require(p, ADMIN, action="reading the tenant's statistics")
    except Problem as exc:
        raise PageError(exc.status, exc.title, f"{exc.detail}.") from None
    n_days = WINDOWS[since]
    since_day = None if n_days is None else int(time.time() // 86400) - (n_days - 1)
    store = request.app.state.store
    found = await numbers(store, p.tenant_id, since_day)
    overall = found["overall"]
    overall["stuck"] = [
        s.to_dict() for s in await StuckPolicy.from_env().find(store) if s.tenant_id == p.tenant_id
    ]
    overall["stuck_runs"] = len(overall["stuck"])
    stuck: dict[tuple[str, str], int] = {}
    for s in overall["stuck"]:
        stuck[(s["name"], s["version"])] = stuck.get((s["name"], s["version"]), 0) + 1
    targets = sorted(found["targets"], key=lambda g: (-g["runs"], g["agent"]))
    for g in targets:
        g["stuck_runs"] = stuck.get((g["agent"], g["version"]), 0)
    series = found["series"]
    drawn = [
        charts.line_chart(series, "completion_rate", "Completion rate per day", _rate),
        charts.line_chart(series, "cost_per_run_usd", "Cost per run per day", render.money),
        charts.line_chart(series, "p95_seconds", "Duration p95 per day", render.seconds),
    ]
    most = max(overall["by_status"].values(), default=0)
    return render.page(
        request, "numbers.html", title="Numbers", since=since, windows=list(WINDOWS),
        n=overall, targets=targets[:_MAX_TARGETS], more_targets=len(targets) > _MAX_TARGETS,
        charts=[c for c in drawn if c is not None], most=most, days=days_of(found["days"]),
        precision=round(PRECISION * 100),
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
