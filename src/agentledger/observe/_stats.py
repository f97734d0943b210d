"""The five numbers: completion rate, p50/p95 duration, cost per run, which step fails
(with the average cost and seconds of each failure), and stuck runs.

:func:`stats` is what ``agentledger stats`` prints and what ``GET /v1/stats`` returns
(``Stats.to_dict()``). Figures come from SQL on the store (observe_stats.py).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from agentledger.observe._queries import stats as observe_stats
from agentledger.observe._stuck import StuckPolicy
from agentledger.store._sqlstore import Store

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
FINISHED = ("completed", "failed", "cancelled", "expired", "needs_human")


def parse_since(text: str | None) -> float | None:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` as a number of seconds; None or ``all``
    for no window. A number without a unit is refused: ``7`` meant as days would
    otherwise be read as seconds and show an empty window."""
    if text is None or text.strip().lower() in ("", "all"):
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not found:
        raise ValueError(
            f"--since {text!r}: give a number and a unit (s, m, h, d or w), e.g. 7d, 12h, "
            "30m, or all"
        )
    return float(found.group(1)) * _UNITS[found.group(2)]


@dataclass
class Stats:
    """The five numbers over a window of runs."""

    since: float | None  # UNIX seconds; None: every run
    agent: str | None
    tenant: str | None  # None: every tenant
    runs: int
    by_status: dict[str, int]
    completion_rate: float | None  # completed / finished
    p50_seconds: float | None
    p95_seconds: float | None
    cost_per_run_usd: float | None
    cost_usd: float
    tokens: int
    # Runs whose tokens and cost a scripted (offline) model simulated: part of the totals.
    simulated_runs: int = 0
    failing_steps: list[dict[str, Any]] = field(default_factory=list)
    stuck: list[dict[str, Any]] = field(default_factory=list)
    version: str | None = None
    # With ``bucket="day"``: the numbers per agent, version and UTC day of creation
    # (see observe_stats.by_target), each with its completion rate and cost per run.
    series: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["stuck_runs"] = len(self.stuck)
        return data


async def stats(
    store: Store,
    since: float | None = None,
    agent: str | None = None,
    policy: StuckPolicy | None = None,
    tenant: str | None = None,
    version: str | None = None,
    bucket: str | None = None,
) -> Stats:
    """The five numbers for runs created in the last ``since`` seconds (None: all),
    optionally of one agent or workflow (and one of its versions), of one tenant (None:
    every tenant); with ``bucket="day"`` also per agent, version and day. Mount this at
    ``GET /v1/stats``."""
    if bucket not in (None, "day"):
        raise ValueError(f"bucket {bucket!r}: the one bucket is day")
    start = None if since is None else time.time() - since
    raw = await store.read(observe_stats.run_stats, start, agent, tenant, version)
    finished = sum(n for s, n in raw["by_status"].items() if s in FINISHED)
    stuck = await (policy or StuckPolicy.from_env()).find(store)
    if agent is not None:
        stuck = [s for s in stuck if s.name == agent]
    if tenant is not None:
        stuck = [s for s in stuck if s.tenant_id == tenant]
    if version is not None:
        stuck = [s for s in stuck if s.version == version]
    series = None
    if bucket == "day":
        groups = await store.read(observe_stats.by_target, start, agent, tenant, version, True)
        series = [with_rates(g) for g in groups]
    return Stats(
        since=start,
        agent=agent,
        tenant=tenant,
        runs=raw["runs"],
        by_status=raw["by_status"],
        completion_rate=(raw["by_status"].get("completed", 0) / finished) if finished else None,
        p50_seconds=raw["duration"]["p50"],
        p95_seconds=raw["duration"]["p95"],
        cost_per_run_usd=(raw["cost_usd"] / raw["runs"]) if raw["runs"] else None,
        cost_usd=raw["cost_usd"],
        tokens=raw["tokens"],
        simulated_runs=int(raw.get("simulated_runs", 0)),
        failing_steps=raw["failing_steps"],
        stuck=[s.to_dict() for s in stuck],
        version=version,
        series=series,
    )


def with_rates(group: dict[str, Any]) -> dict[str, Any]:
    """A group's counts (observe_stats.by_target) with its completion rate and cost
    per run."""
    finished, runs = group["finished"], group["runs"]
    return {
        **group,
        "completion_rate": group["completed"] / finished if finished else None,
        "cost_per_run_usd": group["cost_usd"] / runs if runs else None,
    }
