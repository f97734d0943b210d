"""Watching runs: OpenTelemetry GenAI traces, Prometheus metrics, the five numbers,
stuck runs, and resume from the failed step.

Layering: this package imports the kernel, never the other way round. Importing it
installs its spans and histograms as the engine's hooks (``engine/hooks.py``), so a
process that imports any part of it (the CLI, the service) traces its runs.
"""

from agentledger.observe import tracing as _tracing

_tracing.install()
