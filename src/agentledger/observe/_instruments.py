"""This process's Prometheus instruments: what only the process sees (attempt durations,
model calls, stuck episodes it reported). The store's figures are in metrics.py."""

from __future__ import annotations

from typing import Any

from agentledger.observe import _semconv as sc

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram
except ModuleNotFoundError:  # no metrics extra: nothing can scrape them, so record nothing

    class _Unrecorded:
        """An instrument without prometheus-client: every observation is dropped."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def labels(self, *values: str) -> _Unrecorded:
            return self

        def observe(self, amount: float) -> None:
            pass

        def inc(self, amount: float = 1) -> None:
            pass

    CollectorRegistry = Histogram = Counter = _Unrecorded  # type: ignore[assignment,misc]

#: This process's instruments (histograms and counters only the process can see).
PROCESS = CollectorRegistry(auto_describe=True)
STEP_DURATION = Histogram(
    "agentledger_step_duration_seconds",
    "Duration of tool step attempts, by tool, effect class and outcome.",
    ("tool", "effect", "outcome"),
    buckets=sc.DURATION_BUCKETS,
    registry=PROCESS,
)
TOKEN_USAGE = Histogram(
    sc.PROM_TOKEN_USAGE,
    "Tokens per model call (gen_ai.client.token.usage).",
    ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"),
    buckets=sc.TOKEN_USAGE_BUCKETS,
    registry=PROCESS,
)
OPERATION_DURATION = Histogram(
    sc.PROM_OPERATION_DURATION,
    "Duration of model calls (gen_ai.client.operation.duration).",
    ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "error_type"),
    buckets=sc.DURATION_BUCKETS,
    registry=PROCESS,
)
STUCK_REPORTED = Counter(
    "agentledger_stuck_reported",
    "Stuck-run episodes this process reported (a run.stuck event each).",
    ("reason",),
    registry=PROCESS,
)
