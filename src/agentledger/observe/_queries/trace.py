"""A run's trace context (W3C traceparent), written once by its first execution."""

from __future__ import annotations

from agentledger.store._tx import Tx


def claim_trace_context(tx: Tx, run_id: str, context: str) -> str | None:
    """Store ``context`` unless the run has one; return the run's context (the first one
    stored wins, so every execution of a run joins one trace)."""
    tx.execute(
        "UPDATE runs SET trace_context = :c WHERE id = :id AND trace_context IS NULL",
        {"c": context, "id": run_id},
    )
    return get_trace_context(tx, run_id)


def get_trace_context(tx: Tx, run_id: str) -> str | None:
    found = tx.fetchall("SELECT trace_context FROM runs WHERE id = :id", {"id": run_id})
    return found[0]["trace_context"] if found else None
