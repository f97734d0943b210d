"""Watching runs: OpenTelemetry GenAI traces, Prometheus metrics, the five numbers,
stuck runs, and resume from the failed step.

Layering: this package imports the kernel, never the other way round. Importing it
installs its spans and histograms as the engine's hooks (``engine/_hooks.py``), so a
process that imports any part of it (the CLI, the service) traces its runs.
"""

from agentledger.observe import _tracing as _tracing
from agentledger.observe._tracing import configure_otlp, set_provider

_tracing.install()

__all__ = ["configure_otlp", "set_provider"]
