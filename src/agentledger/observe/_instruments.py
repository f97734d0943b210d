"""This process's Prometheus instruments: what only the process sees (attempt durations,
model calls, stuck episodes it reported). The store's figures are in metrics.py."""

from __future__ import annotations

import threading
from typing import Any

from agentledger.observe import _semconv as sc

# Built on first use, not at import: prometheus-client is a costly import that every
# command would pay (this module comes with agentledger.observe), while only workers and
# servers record anything.
_NAMES = ("PROCESS", "STEP_DURATION", "TOKEN_USAGE", "OPERATION_DURATION", "STUCK_REPORTED")
_built: dict[str, Any] = {}
_lock = threading.Lock()


def _build() -> dict[str, Any]:
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

    # This process's instruments (histograms and counters only the process can see).
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
        (
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "gen_ai_token_type",
        ),
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
    return {
        "PROCESS": PROCESS,
        "STEP_DURATION": STEP_DURATION,
        "TOKEN_USAGE": TOKEN_USAGE,
        "OPERATION_DURATION": OPERATION_DURATION,
        "STUCK_REPORTED": STUCK_REPORTED,
    }


def __getattr__(name: str) -> Any:
    """``PROCESS`` (this process's registry) and its instruments, made on first use."""
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        if not _built:
            _built.update(_build())
    return _built[name]
