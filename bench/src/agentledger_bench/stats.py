"""One percentile for every benchmark, so their figures are read the same way."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The value below which a ``q`` share of ``values`` lies (the sample at index
    ``int(q * n)``, the last one for ``q`` near 1); NaN when there are none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
