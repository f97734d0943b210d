"""PostgreSQL: a journal batch as one statement (committed by :mod:`pg_async`).

On PostgreSQL every statement is a network round trip, so the generic path
(savepoint, fence, step, events, release: five per batch) is slow. Here each
plain batch -- a fence, at most two journal entries and its audit events -- is ONE
statement: data-modifying CTEs that insert only ``FROM fence``, so a batch whose
fence fails writes nothing and needs no savepoint.

The batch's parameters come from its encoding (``queries.journal.EncodedBatch``),
made once when the batch was checked, with every text already sanitized.

Batches that claim effects, write outbox rows or approvals take the generic path.
"""

from __future__ import annotations

import functools
from typing import Any

from agentledger.store._base import Batch
from agentledger.store._postgres.connection import NOW_SQL, convert_placeholders
from agentledger.store._queries.journal import STEP_COLUMNS, STEP_UPSERT, encode_batch

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


@functools.lru_cache(maxsize=8)
def _steps_part(n: int) -> str:
    """The journal entries ``s0_*``, ``s1_*``, ... inserted only FROM fence."""
    if n == 1:
        values = ", ".join(f":s0_{name}::{kind}" for name, kind in _STEP_VALUE_TYPES)
        return f"s AS (INSERT INTO steps ({STEP_COLUMNS}) SELECT {values} FROM fence {STEP_UPSERT})"
    rows = ", ".join(
        "(" + ", ".join(f":s{i}_{name}::{kind}" for name, kind in _STEP_VALUE_TYPES) + ")"
        for i in range(n)
    )
    names = ", ".join(name for name, _ in _STEP_VALUE_TYPES)
    return (
        f"s AS (INSERT INTO steps ({STEP_COLUMNS}) SELECT v.* FROM fence, (VALUES {rows}) "
        f"AS v({names}) {STEP_UPSERT})"
    )


def is_plain(batch: Batch) -> bool:
    """True when the batch fits in one statement."""
    return (
        not (batch.effects or batch.outbox or batch.approvals or batch.drop_outbox)
        and len(batch.steps) <= 2  # a write's ``started`` may carry a held outcome
        and len({s.step_no for s in batch.steps}) == len(batch.steps)
    )


def batch_statement(batch: Batch) -> tuple[str, dict[str, Any]]:
    """One statement for a plain batch; it returns the number of fenced rows (0 or 1)
    and the run's cancel request. (It notifies no one: see
    :mod:`agentledger.store._postgres.notifier`.)

    It uses the batch's encoding (made once by ``validate_batch``; its text already
    sanitized), and passes each event as its own parameters in a ``VALUES`` list:
    a text value costs the driver nothing to send, a ``text[]`` element is escaped."""
    encoded = encode_batch(batch)
    fence_sql, params = encoded.fence(NOW_SQL)
    parts = [f"fence AS ({fence_sql} RETURNING id, event_seq, cancel_requested)"]
    if encoded.steps:
        for i, step in enumerate(encoded.steps):
            names = _step_names(i)
            params.update({names[k]: v for k, v in step.items()})
        parts.append(_steps_part(len(encoded.steps)))
    events = encoded.events
    if events:
        for i, event in enumerate(events):
            params.update(zip(_event_names(i), event, strict=True))
        parts.append(_events_part(len(events)))
    # The run's cancel request comes back with the fence (see Batch.cancel_requested).
    sql = (
        "WITH " + ", ".join(parts) + " SELECT COUNT(*) AS fenced, "
        "MAX(cancel_requested) AS cancel_requested FROM fence"
    )
    return convert_placeholders(sql), params


@functools.lru_cache(maxsize=8)
def _step_names(i: int) -> dict[str, str]:
    """The parameter names of journal entry ``i`` (``s<i>_<column>``), made once."""
    return {name: f"s{i}_{name}" for name, _ in _STEP_VALUE_TYPES}


@functools.lru_cache(maxsize=64)
def _event_names(i: int) -> tuple[str, str, str]:
    """The parameter names of event ``i``: its type, actor and data."""
    return f"e{i}_t", f"e{i}_a", f"e{i}_d"


@functools.lru_cache(maxsize=64)
def _events_part(n: int) -> str:
    rows = ", ".join(f"(:e{i}_t::text, :e{i}_a::text, :e{i}_d::text, {i + 1})" for i in range(n))
    return (
        "e AS (INSERT INTO events (run_id, at, type, actor, data, seq) "
        "SELECT fence.id, :now::float8, ev.type, ev.actor, ev.data, "
        f"fence.event_seq - :n_events::bigint + ev.n FROM fence, (VALUES {rows}) "
        "AS ev(type, actor, data, n))"
    )
