"""PostgreSQL: a journal batch as one statement (committed by :mod:`pg_async`).

On PostgreSQL every statement is a network round trip, so the generic path
(savepoint, fence, step, events, release: five per batch) is slow. Here each
plain batch -- a fence, at most one journal entry and its audit events -- is ONE
statement: data-modifying CTEs that insert only ``FROM fence``, so a batch whose
fence fails writes nothing and needs no savepoint.

Batches that claim effects, write outbox rows or approvals take the generic path.
"""

from __future__ import annotations

from typing import Any

from agentledger.records import dumps
from agentledger.store.base import Batch
from agentledger.store.dialect import clean_params
from agentledger.store.postgres.connection import NOW_SQL, convert_placeholders
from agentledger.store.queries import STEP_COLUMNS, STEP_UPSERT, fence_update, step_params
from agentledger.store.queries.events import batch_events

# Parameter name and type of each steps column, in STEP_COLUMNS order. The casts
# are needed because INSERT ... SELECT does not infer types from the target.
_STEP_VALUE_TYPES = (
    ("run_id", "text"),
    ("step_no", "int"),
    ("kind", "text"),
    ("name", "text"),
    ("status", "text"),
    ("input", "text"),
    ("input_hash", "text"),
    ("output", "text"),
    ("attempts", "int"),
    ("key", "text"),
    ("started_at", "float8"),
    ("duration_ms", "float8"),
    ("tokens", "bigint"),
    ("cost_usd", "float8"),
    ("error_class", "text"),
    ("error", "text"),
    ("lease_epoch", "bigint"),
)
_STEP_VALUES = ", ".join(f":s_{name}::{kind}" for name, kind in _STEP_VALUE_TYPES)


def is_plain(batch: Batch) -> bool:
    """True when the batch fits in one statement."""
    return (
        not (batch.effects or batch.outbox or batch.approvals or batch.drop_outbox)
        and len(batch.steps) <= 1
    )


def batch_statement(batch: Batch) -> tuple[str, dict[str, Any]]:
    """One statement for a plain batch; it returns the number of fenced rows (0 or 1)
    and the run's cancel request."""
    fence_sql, params = fence_update(batch, NOW_SQL)
    parts = [f"fence AS ({fence_sql} RETURNING id, event_seq, cancel_requested)"]
    if batch.steps:
        params.update({f"s_{k}": v for k, v in step_params(batch.steps[0]).items()})
        parts.append(
            f"s AS (INSERT INTO steps ({STEP_COLUMNS}) SELECT {_STEP_VALUES} FROM fence "
            f"{STEP_UPSERT})"
        )
    events = batch_events(batch)
    if events:
        params["ev_type"] = [e.type for e in events]
        params["ev_actor"] = [e.actor for e in events]
        params["ev_data"] = [dumps(e.data) for e in events]
        parts.append(
            "e AS (INSERT INTO events (run_id, at, type, actor, data, seq) "
            "SELECT fence.id, :now::float8, ev.type, ev.actor, ev.data, "
            "fence.event_seq - :n_events::bigint + ev.n FROM fence, "
            "unnest(:ev_type::text[], :ev_actor::text[], :ev_data::text[]) "
            "WITH ORDINALITY AS ev(type, actor, data, n))"
        )
    params = clean_params(params)  # no text the driver refuses (NUL, lone surrogates)
    # The run's cancel request comes back with the fence (see Batch.cancel_requested).
    sql = (
        "WITH " + ", ".join(parts) + " SELECT COUNT(*) AS fenced, "
        "MAX(cancel_requested) AS cancel_requested FROM fence"
    )
    return convert_placeholders(sql), params
