"""Shared pieces of the SQL: run columns and time-ordered ids."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from agentledger._randomness import random_hex
from agentledger.errors import UsageError
from agentledger.records import RunStatus, dumps
from agentledger.store._base import UnstorableValue

RUN_COLUMNS = (
    "id, tenant_id, user_id, kind, name, version, input, status, step_count, tokens, "
    "cost_usd, active_seconds, created_at, updated_at, lease_owner, lease_epoch, "
    "lease_expires_at, available_at, resumes, result, error, handover_reason, cancel_requested, "
    "request_id, principal, usage_simulated, restored_at"
)


def new_token() -> str:
    """A random token that marks one write (see ``runs.write_token``)."""
    return random_hex(8)


def new_id(prefix: str = "") -> str:
    """A time-ordered id: milliseconds then randomness, so ids sort by creation."""
    return f"{prefix}{int(time.time() * 1000):011x}{random_hex(5)}"


def check_finite(name: str, value: float | None) -> None:
    """Refuse NaN and the infinities (None passes): a time or an amount that no
    comparison can order would park a run forever or pin a lease that never expires."""
    if value is None or isinstance(value, int):
        return
    if not isinstance(value, float) or not math.isfinite(value):
        raise UnstorableValue(f"{name} must be a finite number (got {value!r})")


def check_time(name: str, value: float | None) -> None:
    """A point in time given by a caller: None or finite."""
    check_finite(name, value)


def check_lease(seconds: float) -> None:
    """A lease length: finite (a lease that never expires strands its run). A worker's
    own lower bound is its configuration's (worker/_config.py); a lease already expired
    (0 or less) is allowed, tests use it to hand a run over at once."""
    check_finite("lease_seconds", seconds)


CLOCK_RESOLUTION = 0.001  # seconds: the coarsest database clock (SQLite julianday)


def delay_of(at: float | None) -> float | None:
    """A time read on the caller's clock, as a delay from now on that same clock.

    Written as ``<database now> + delay``: the offset between the caller's clock and the
    database's cancels out, so a worker whose clock is a minute off parks a run for as
    long as it meant, never a minute too long or too short (docs/architecture.md).
    SQLite reads its clock in whole milliseconds, so the delay is rounded up by one: a
    park never ends before the time meant (a Retry-After is honoured, not shaved).
    """
    return None if at is None else at - time.time() + CLOCK_RESOLUTION


def json_text(name: str, value: Any) -> str:
    """``value`` as the JSON text of a column; NaN and the infinities are refused (JSON
    cannot carry them: stored, they would make every reader of the column fail)."""
    text = dumps(value)
    if "NaN" in text or "Infinity" in text:  # cheap screen; the strict encode decides
        try:
            json.dumps(value, allow_nan=False, default=str)
        except ValueError as exc:
            raise UnstorableValue(f"{name} holds a value JSON cannot carry ({exc})") from exc
    return text


def in_list(prefix: str, values: list[Any]) -> tuple[str, dict[str, Any]]:
    """``values`` as the placeholders of an ``IN (...)`` and their parameters:
    (``":p0, :p1"``, ``{"p0": ..., "p1": ...}``) for prefix ``p``."""
    params = {f"{prefix}{i}": value for i, value in enumerate(values)}
    return ", ".join(f":{name}" for name in params), params


def status_literal(status: str) -> str:
    """``status`` as an SQL literal, after checking it is a run state.

    A filter on one state is written as a literal, not a parameter: the driver prepares
    a statement run often, and a plan made once for any state assumes every state is
    common, so it would walk the whole history newest first looking for a rare one
    (``needs_human``) instead of reading that state's runs from ``runs_status_created``.
    """
    if status not in RunStatus.ALL:
        raise UsageError(f"no run state {status!r}; give one of {', '.join(RunStatus.ALL)}")
    return f"'{status}'"
