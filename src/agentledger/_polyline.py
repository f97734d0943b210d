"""SVG line drawing shared by the console's charts and the soak's plot: values to points
in a box, and points to one path whose gaps stay gaps."""

from __future__ import annotations

from collections.abc import Sequence


def y_of(value: float, top: float, height: float, pad: float) -> float:
    """The drawing's y of ``value`` on a scale from 0 (bottom) to ``top`` (top)."""
    return height - pad - (height - 2 * pad) * value / (top or 1.0)


def path_d(points: Sequence[tuple[float, float] | None]) -> str:
    """An SVG path's ``d`` through ``points``; a None breaks the line (no point is
    invented). One path of several pieces (each "M" starts one); a lone point shows as
    a dot by the stroke's round cap."""
    runs: list[list[str]] = [[]]
    for point in points:
        if point is None:
            runs.append([])
        else:
            runs[-1].append(f"{point[0]:.1f},{point[1]:.1f}")
    return " ".join("M " + " L ".join(r if len(r) > 1 else r * 2) for r in runs if r)
