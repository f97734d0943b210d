"""The soak's plot: one SVG, memory over time above latency over time, on a shared time
axis, with the worker kills and PostgreSQL restarts marked."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from agentledger._polyline import path_d, y_of

WIDTH, PANEL, PAD = 960, 220, 10
LEFT, TOP, GAP = 70, 50, 60  # room for the value labels, the title, the time labels
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
KILL, RESTART = "#d62728", "#888"  # a worker kill's tick, a PostgreSQL restart's line
PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "worker memory (RSS, MB)",
        "MB",
        (("rss_total_mb", "all workers"), ("rss_max_mb", "largest worker")),
    ),
    (
        "step latency in each interval (ms)",
        "ms",
        (("step_p50_ms", "p50"), ("step_p95_ms", "p95"), ("step_p99_ms", "p99")),
    ),
)


def _value(row: dict[str, Any], column: str) -> float | None:
    v = row.get(column)
    return None if v in ("", None) else float(v)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def write_svg(
    rows: list[dict[str, Any]],
    kills_at: list[float],
    restarts_at: list[float],
    seconds: float,
    path: Path,
) -> None:
    """Draw the samples ``rows`` (``sampling.COLUMNS``) of a soak ``seconds`` long."""
    end = max([seconds, *(float(r["t_s"]) for r in rows)]) or 1.0
    inner = WIDTH - LEFT - PAD

    def x_of(t: float) -> float:
        return LEFT + inner * t / end

    height = TOP + len(PANELS) * (PANEL + GAP)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="16" font-size="14">agentledger soak: {len(rows)} samples, '
        f"{len(kills_at)} worker kills (red ticks), {len(restarts_at)} PostgreSQL restarts "
        "(grey lines)</text>",
    ]
    for n, (title, unit, lines) in enumerate(PANELS):
        y0 = TOP + n * (PANEL + GAP)
        values = [v for r in rows for c, _ in lines if (v := _value(r, c)) is not None]
        top = max(values, default=0.0) * 1.1 or 1.0
        parts.append(f'<g transform="translate(0,{y0})">')
        parts.append(
            f'<rect x="{LEFT}" y="0" width="{inner}" height="{PANEL}" fill="none" stroke="#999"/>'
        )
        parts.append(f'<text x="{LEFT}" y="-6">{escape(title)}</text>')
        for frac in (0.0, 0.5, 1.0):
            y = y_of(top * frac, top, PANEL, PAD)
            parts.append(
                f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                f"{top * frac:.0f} {unit}</text>"
            )
            parts.append(
                f'<line x1="{LEFT}" x2="{LEFT + inner}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            )
        for t in restarts_at:
            parts.append(
                f'<line x1="{x_of(t):.1f}" x2="{x_of(t):.1f}" y1="0" y2="{PANEL}" '
                f'stroke="{RESTART}" stroke-dasharray="4 3"/>'
            )
        for t in kills_at:
            parts.append(
                f'<line x1="{x_of(t):.1f}" x2="{x_of(t):.1f}" y1="{PANEL - 8}" y2="{PANEL}" '
                f'stroke="{KILL}"/>'
            )
        for i, (column, label) in enumerate(lines):
            points = [
                None if (v := _value(r, column)) is None else (x_of(float(r["t_s"])), v)
                for r in rows
            ]
            scaled = [None if p is None else (p[0], y_of(p[1], top, PANEL, PAD)) for p in points]
            parts.append(
                f'<path d="{path_d(scaled)}" fill="none" stroke="{COLOURS[i]}" '
                'stroke-width="1.5" stroke-linecap="round" stroke-linejoin="round"/>'
            )
            # The legend above the panel, right of its title: clear of the lines.
            lx = LEFT + 320 + i * 140
            parts.append(
                f'<line x1="{lx}" x2="{lx + 20}" y1="-10" y2="-10" stroke="{COLOURS[i]}" '
                'stroke-width="2"/>'
            )
            parts.append(f'<text x="{lx + 25}" y="-6">{escape(label)}</text>')
        for k in range(5):
            t = end * k / 4
            parts.append(
                f'<text x="{x_of(t):.1f}" y="{PANEL + 16}" text-anchor="middle">'
                f"{_minutes(t)}</text>"
            )
        parts.append("</g>")
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")
