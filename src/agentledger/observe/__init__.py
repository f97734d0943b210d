"""Watching runs: OpenTelemetry GenAI traces, Prometheus metrics, the five numbers,
stuck runs, and resume from the failed step.

Layering: this package reads the store and is called by the engine, the worker and the
CLI; it imports none of them.
"""
