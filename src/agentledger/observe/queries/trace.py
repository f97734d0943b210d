"""A run's trace context (W3C traceparent), written once by its first execution."""

from __future__ import annotations

from typing import Any

from agentledger.store.dialect import Dialect


def claim_trace_context(d: Dialect, conn: Any, run_id: str, context: str) -> str | None:
    """Store ``context`` unless the run has one; return the run's context (the first one
    stored wins, so every execution of a run joins one trace)."""
    d.execute(
        conn,
        "UPDATE runs SET trace_context = :c WHERE id = :id AND trace_context IS NULL",
        {"c": context, "id": run_id},
    )
    return get_trace_context(d, conn, run_id)


def get_trace_context(d: Dialect, conn: Any, run_id: str) -> str | None:
    found = d.fetchall(conn, "SELECT trace_context FROM runs WHERE id = :id", {"id": run_id})
    return found[0]["trace_context"] if found else None
