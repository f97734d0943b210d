"""Line charts drawn on the server: one SVG polyline per agent and version over days,
each chart with the same figures as a table (the chart is an image to a screen reader;
the table is what it reads)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentledger._polyline import path_d, y_of

WIDTH, HEIGHT = 1000, 220
_PAD = 10  # room above the top value and below zero
MAX_LINES = 6  # the agents and versions with the most runs get a line (and a colour)
MAX_DAYS = 60


@dataclass
class Line:
    """One agent and version: its points in the drawing and its values by day."""

    target: str
    colour: int
    points: str  # an SVG path's d
    values: dict[int, float | None]
    dots: list[tuple[float, float]] = field(default_factory=list)  # each day's value


@dataclass
class Chart:
    """A drawn figure: its lines, the largest value (the top of the drawing), the days."""

    key: str
    title: str
    lines: list[Line]
    top: float
    days: list[int]
    shown: Callable[[float | None], str]
    dates: dict[int, str] = field(default_factory=dict)


def date_of(day: int) -> str:
    """A UTC day number as ``2026-12-02``."""
    return dt.datetime.fromtimestamp(day * 86400, tz=dt.UTC).strftime("%Y-%m-%d")


def top_targets(series: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The agents and versions with the most runs, at most ``MAX_LINES``."""
    runs: dict[tuple[str, str], int] = {}
    for g in series:
        key = (g["agent"], g["version"])
        runs[key] = runs.get(key, 0) + g["runs"]
    return sorted(runs, key=lambda k: (-runs[k], k))[:MAX_LINES]


def line_chart(
    series: list[dict[str, Any]],
    metric: str,
    title: str,
    shown: Callable[[float | None], str],
) -> Chart | None:
    """``metric`` of each of the top agents and versions per day; None without data.
    A day without a value for a line breaks that line (no point is invented)."""
    targets = top_targets(series)
    days = sorted({g["day"] for g in series})[-MAX_DAYS:]
    if not targets or not days:
        return None
    table: dict[tuple[str, str], dict[int, float | None]] = {t: {} for t in targets}
    for g in series:
        key = (g["agent"], g["version"])
        if key in table and g["day"] in days:
            table[key][g["day"]] = g.get(metric)
    values = [v for row in table.values() for v in row.values() if v is not None]
    top = max(values, default=0.0) or 1.0
    step = (WIDTH - 2 * _PAD) / max(len(days) - 1, 1)
    lines = []
    for colour, key in enumerate(targets):
        points: list[tuple[float, float] | None] = []
        for i, day in enumerate(days):
            v = table[key].get(day)
            x = _PAD + i * step if len(days) > 1 else WIDTH / 2
            points.append(None if v is None else (x, y_of(v, top, HEIGHT, _PAD)))
        dots = [(round(p[0], 1), round(p[1], 1)) for p in points if p is not None]
        lines.append(Line(f"{key[0]}@{key[1]}", colour, path_d(points), table[key], dots))
    return Chart(metric, title, lines, top, days, shown, {d: date_of(d) for d in days})
