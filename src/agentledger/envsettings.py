"""Settings read from environment variables: one parser, one kind of error message."""

from __future__ import annotations

import math
import os

from agentledger.errors import UsageError


def seconds_from_env(
    name: str,
    default: float,
    *,
    minimum: float = 0.0,
    maximum: float = math.inf,
    above_minimum: bool = False,
) -> float:
    """``$name`` as a finite number of seconds within the bounds, or ``default`` when
    unset or empty. Anything else raises :class:`UsageError` naming the variable, the
    allowed range and the default (NaN, infinity and words are refused)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    low_ok = value > minimum if above_minimum else value >= minimum
    if not (math.isfinite(value) and low_ok and value <= maximum):
        if math.isinf(maximum):
            wanted = f"more than {minimum:g}" if above_minimum else f"{minimum:g} or more"
        else:
            wanted = f"from {minimum:g} to {maximum:g}"
        raise UsageError(
            f"{name} must be a number of seconds {wanted} (got {raw!r}); "
            f"unset it for the default ({default:g})"
        )
    return value
