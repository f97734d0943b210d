"""PostgreSQL: a group of journal batches in one round trip.

On PostgreSQL every statement is a network round trip, so the generic path
(savepoint, fence, step, events, release: five per batch) is slow. Here each
plain batch -- a fence, at most one journal entry and its audit events -- is ONE
statement: data-modifying CTEs that insert only ``FROM fence``, so a batch whose
fence fails writes nothing and needs no savepoint. The statements of a whole
group, with BEGIN and COMMIT, are sent in pipeline mode and answered after one
sync; the answers are read only after COMMIT succeeded, i.e. once durable.

Batches that claim effects, write outbox rows or approvals take the generic path.
"""

from __future__ import annotations

from typing import Any

from psycopg import Connection

from agentledger.errors import LeaseLost
from agentledger.records import dumps
from agentledger.store.base import Batch
from agentledger.store.postgres import convert_placeholders
from agentledger.store.queries import STEP_COLUMNS, STEP_UPSERT, fence_update, step_params

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
    return not (batch.effects or batch.outbox or batch.approvals) and len(batch.steps) <= 1


def batch_statement(batch: Batch) -> tuple[str, dict[str, Any]]:
    """One statement for a plain batch; it returns the number of fenced rows (0 or 1)."""
    fence_sql, params = fence_update(batch)
    parts = [f"fence AS ({fence_sql} RETURNING id)"]
    if batch.steps:
        params.update({f"s_{k}": v for k, v in step_params(batch.steps[0]).items()})
        parts.append(
            f"s AS (INSERT INTO steps ({STEP_COLUMNS}) SELECT {_STEP_VALUES} FROM fence "
            f"{STEP_UPSERT})"
        )
    if batch.events:
        params["ev_type"] = [e.type for e in batch.events]
        params["ev_actor"] = [e.actor for e in batch.events]
        params["ev_data"] = [dumps(e.data) for e in batch.events]
        parts.append(
            "e AS (INSERT INTO events (run_id, at, type, actor, data) "
            "SELECT fence.id, :now::float8, ev.type, ev.actor, ev.data FROM fence, "
            "unnest(:ev_type::text[], :ev_actor::text[], :ev_data::text[]) "
            "AS ev(type, actor, data))"
        )
    sql = "WITH " + ", ".join(parts) + " SELECT COUNT(*) AS fenced FROM fence"
    return convert_placeholders(sql), params


def apply_plain_batches(conn: Connection[Any], batches: list[Batch]) -> list[LeaseLost | None]:
    """Run plain batches and COMMIT, pipelined: BEGIN, the statements and COMMIT travel
    together and are answered after one sync, so a group costs one round trip.
    A group of one is a single autocommitted statement."""
    if len(batches) == 1:
        # One statement is its own transaction in autocommit mode: one round trip,
        # durable when it returns (synchronous_commit is on).
        conn.autocommit = True
        try:
            cursors = [conn.execute(*batch_statement(batches[0]))]
        finally:
            conn.autocommit = False
    else:
        with conn.pipeline():
            cursors = [conn.execute(*batch_statement(b)) for b in batches]
            conn.commit()
    outcomes: list[LeaseLost | None] = []
    for batch, cursor in zip(batches, cursors, strict=True):
        row = cursor.fetchone()
        fenced = int(row["fenced"] if isinstance(row, dict) else row[0]) if row else 0
        outcomes.append(None if fenced else LeaseLost(batch.run_id, batch.epoch))
    return outcomes
