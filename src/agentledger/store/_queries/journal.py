"""The journal: fenced batches (the fence, step rows, effects) and reading it back."""

from __future__ import annotations

import time
from dataclasses import dataclass
from math import isfinite
from typing import Any

from agentledger._canonical import clean_text
from agentledger.errors import LeaseLost
from agentledger.records import (
    Effect,
    EffectStatus,
    RunStatus,
    Step,
    dumps,
)
from agentledger.store import _rows as rows
from agentledger.store._base import (
    _UNSET,
    Batch,
    EffectClaimed,
    UnstorableBatch,
    UnstorableValue,
)
from agentledger.store._dialect import CleanParams
from agentledger.store._queries.approvals import insert_approval
from agentledger.store._queries.common import check_finite, check_time, delay_of, json_text
from agentledger.store._queries.events import insert_encoded_events, step_event_data
from agentledger.store._queries.outbox import drop_outbox, insert_outbox
from agentledger.store._tx import Tx


def load_journal(tx: Tx, run_id: str) -> list[Step]:
    found = tx.fetchall("SELECT * FROM steps WHERE run_id = :id ORDER BY step_no", {"id": run_id})
    return [rows.step_from(r) for r in found]


# Where the dialect's clock goes in an encoded fence (see ``EncodedBatch.fence_template``).
_NOW = "%NOW%"


@dataclass(slots=True)
class EncodedBatch:
    """Everything a batch writes, encoded once: by :func:`validate_batch` before the
    batch joins a group, then reused by :func:`apply_batch` and PostgreSQL's
    one-statement path (the JSON of steps and events is never encoded twice).

    Text parameters are already sanitized (``clean_text``). The two values that depend
    on when the batch is applied -- ``now`` and a park's ``available_in`` -- are
    recomputed by :meth:`fence`."""

    fence_template: str  # the fence UPDATE with ``_NOW`` where the database clock goes
    fence_params: dict[str, Any]
    available_at: float | None  # a park's time on the writer's clock (None: no park)
    steps: list[dict[str, Any]]  # step_params of each journal entry
    events: list[tuple[str, str, str]]  # (type, actor, data JSON), step events first
    # The run's event_seq after this batch's fence (its last event's seq), set by the
    # fence or read after it (fence_batch, write_fenced).
    last_seq: int | None = None

    def fence(self, now_sql: str) -> tuple[str, dict[str, Any]]:
        """The fence: an UPDATE of the run row that matches only while the lease epoch
        and owner are the writer's (and the run is still running), as SQL and its
        parameters as of now. ``now_sql`` is the dialect's clock
        (:attr:`Dialect.now_sql`): a park time is written as the database's now plus the
        delay the writer meant (see ``common.delay_of``)."""
        params = CleanParams(self.fence_params)
        params["now"] = time.time()
        if "available_in" in params:
            params["available_in"] = delay_of(self.available_at)
        return self.fence_template.replace(_NOW, now_sql), params


def encode_batch(batch: Batch) -> EncodedBatch:
    """Encode ``batch`` (the cached encoding if :func:`validate_batch` made one)."""
    encoded = batch.encoded
    if isinstance(encoded, EncodedBatch):
        return encoded
    # The batch's events, encoded as they are built: first one ``step.<status>`` per
    # journal entry (its data from the entry, events.step_event_data), written by the
    # batch's owner (cleaned once), then the batch's own events.
    owner = clean_text(batch.owner)
    steps = [step_params(s) for s in batch.steps]
    events = [
        (f"step.{p['status']}", owner, json_text("event data", step_event_data(s)))
        for s, p in zip(batch.steps, steps, strict=True)
    ]
    events += [
        (clean_text(e.type), clean_text(e.actor), json_text("event data", e.data))
        for e in batch.events
    ]
    template, params = _fence(batch, owner, len(events))
    update = batch.run
    encoded = EncodedBatch(
        template,
        params,
        update.available_at if update is not None else None,
        steps,
        events,
    )
    batch.encoded = encoded
    return encoded


def _fence(batch: Batch, owner: str, n_events: int) -> tuple[str, dict[str, Any]]:
    sets = [f"updated_at = {_NOW}", "write_token = :token"]
    params: dict[str, Any] = {
        "now": time.time(),
        "id": clean_text(batch.run_id),
        "epoch": batch.epoch,
        "owner": owner,
        "token": batch.token,
    }
    if n_events:  # the batch's events take the run's next seqs, under the fence
        sets.append("event_seq = event_seq + :n_events")
        params["n_events"] = n_events
    update = batch.run
    if update is not None:
        for name in ("step_count", "tokens", "cost_usd", "active_seconds"):
            value = getattr(update, name)
            if value is not None:
                sets.append(f"{name} = :{name}")
                params[name] = value
        if update.usage_simulated:  # only ever set: a simulated figure stays simulated
            sets.append("usage_simulated = 1")
        for name in ("error", "handover_reason"):
            value = getattr(update, name)
            if value is not _UNSET:
                sets.append(f"{name} = :{name}")
                params[name] = clean_text(value) if isinstance(value, str) else value
        if update.result is not _UNSET:
            sets.append("result = :result")
            params["result"] = json_text("result", update.result)
        if update.status is not None and update.status != RunStatus.RUNNING:
            sets += ["status = :status", "lease_owner = NULL", "lease_expires_at = NULL"]
            sets.append(f"available_at = {_NOW} + :available_in")
            params["status"] = clean_text(update.status)
            params["available_in"] = delay_of(update.available_at)
    sql = (
        f"UPDATE runs SET {', '.join(sets)} WHERE id = :id AND lease_epoch = :epoch "
        "AND lease_owner = :owner AND status = 'running'"
    )
    return sql, params


def refused_before_writing(batch: Batch | None) -> bool:
    """True when ``batch`` can be refused (:class:`LeaseLost`) only by its fence, which
    :func:`apply_batch` runs before any write: refused, it wrote nothing. A batch that
    claims an effect key, writes an outbox row or an approval may be refused
    (:class:`~agentledger.store._base.KeyHeld`) after its fence and steps are written.
    None (a job that is no batch): False."""
    return isinstance(batch, Batch) and not (batch.effects or batch.outbox or batch.approvals)


def apply_batch(tx: Tx, batch: Batch) -> None:
    """Apply one fenced batch: the fence first (a failed fence raises before any write,
    see :func:`refused_before_writing`), then the batch's writes."""
    fence_batch(tx, batch)
    write_fenced(tx, [batch])


def fence_batch(tx: Tx, batch: Batch) -> None:
    """Run ``batch``'s fence: the run's row takes the batch's counters and the seqs of
    its events while the lease is the writer's, else :class:`LeaseLost` (nothing of
    the batch written). Its writes follow by :func:`write_fenced`, in the same
    transaction."""
    encoded = encode_batch(batch)
    sql, params = encoded.fence(tx.now)
    encoded.last_seq = None
    if tx.dialect.fence_returning:
        # The fence hands back the seqs it took and the run's cancel request (the
        # engine stops at its next step boundary: Batch.cancel_requested).
        found = tx.fetchall(sql + " RETURNING event_seq, cancel_requested", params)
        if not found:
            raise LeaseLost(batch.run_id, batch.epoch)
        encoded.last_seq = int(found[0]["event_seq"])
        batch.cancel_requested = found[0]["cancel_requested"]
    elif tx.execute(sql, params) == 0:
        raise LeaseLost(batch.run_id, batch.epoch)


def write_fenced(tx: Tx, batches: list[Batch]) -> None:
    """The writes of ``batches``, in order, each already fenced (:func:`fence_batch`) in
    this transaction: their step rows as one statement run per row (``executemany``),
    their effects, outbox rows and approvals, then their events (the seqs their fences
    took) in multi-row INSERTs. Where the fence did not hand back the seqs and the cancel
    request (``Dialect.fence_returning``), they are read here, once for all: the run's
    ``event_seq`` after the last of its batches, counted back for earlier ones."""
    encoded = [encode_batch(b) for b in batches]
    unread = [e.fence_params["id"] for e in encoded if e.last_seq is None]
    if unread:
        _read_fenced(tx, batches, encoded, unread)
    steps = [params for e in encoded for params in e.steps]
    if len(steps) == 1:  # a driver's executemany costs more than one execute
        tx.execute(_STEP_INSERT, steps[0])
    elif steps:
        tx.executemany(_STEP_INSERT, steps)
    for batch in batches:
        if batch.effects or batch.outbox or batch.approvals or batch.drop_outbox:
            _write_keyed(tx, batch)
    events = []
    for e in encoded:
        if e.events:
            run_id = e.fence_params["id"]  # the run's id, cleaned once
            first = e.last_seq - len(e.events) + 1  # type: ignore[operator]
            events += [(run_id, *event, first + i) for i, event in enumerate(e.events)]
    insert_encoded_events(tx, events)


def _read_fenced(
    tx: Tx, batches: list[Batch], encoded: list[EncodedBatch], unread: list[str]
) -> None:
    """Set the last seq and the cancel request of each batch whose fence did not."""
    among, params = tx.dialect.among("id", sorted(set(unread)))
    found = tx.fetchall(f"SELECT id, event_seq, cancel_requested FROM runs WHERE {among}", params)
    runs = {r["id"]: (int(r["event_seq"]), r["cancel_requested"]) for r in found}
    tops = {run_id: seq for run_id, (seq, _) in runs.items()}
    # A run's later batch took the seqs after its earlier one's: count back from the end.
    for batch, e in zip(reversed(batches), reversed(encoded), strict=True):
        if e.last_seq is None:
            run_id = e.fence_params["id"]
            e.last_seq = tops[run_id]
            tops[run_id] -= len(e.events)
            batch.cancel_requested = runs[run_id][1]


def _write_keyed(tx: Tx, batch: Batch) -> None:
    """A batch's effects, outbox rows and approvals (a taken key raises KeyHeld)."""
    for effect in batch.effects:
        write_effect(tx, effect)
    for item in batch.outbox:
        insert_outbox(tx, item)
    for approval in batch.approvals:
        insert_approval(tx, approval)
    if batch.drop_outbox:
        drop_outbox(tx, batch.run_id, "compensation began")


def committed(tx: Tx, batches: list[Batch]) -> set[str]:
    """The tokens of those ``batches`` that are already committed.

    Asked before a write is retried after a lost connection: the fence writes the
    batch's token on its run row, so a batch whose COMMIT reply was lost is found
    here and not applied (nor answered "lease lost") a second time.
    """
    if not batches:
        return set()
    params = {f"r{i}": b.run_id for i, b in enumerate(batches)}
    marks = ", ".join(f":{k}" for k in params)
    found = tx.fetchall(f"SELECT write_token FROM runs WHERE id IN ({marks})", params)
    tokens = {r["write_token"] for r in found}
    return {b.token for b in batches if b.token in tokens}


_INT64 = (-(2**63), 2**63 - 1)


def validate_batch(batch: Batch) -> None:
    """Encode everything ``batch`` writes, before it joins a group: a batch no database
    can store (an integer past 64 bits, JSON nested too deep to encode) is refused alone
    with :class:`UnstorableBatch`, and never fails the batches committed with it.

    The encoding is kept on the batch (``batch.encoded``) and applied as it is: the
    batch is encoded once. Text is sanitized while it is encoded."""
    batch.encoded = None  # encode what the batch holds now
    try:
        update = batch.run
        if update is not None:
            check_time("available_at", update.available_at)
        encoded = encode_batch(batch)
        _check_flat(encoded.fence_params)
        for params in encoded.steps:
            _check_flat(params)
        if batch.effects or batch.outbox or batch.approvals:
            _check_numbers(_key_values(batch))
    except UnstorableValue as exc:
        batch.encoded = None
        raise UnstorableBatch(f"run {clean_text(batch.run_id)}: {exc}") from exc
    except (RecursionError, ValueError, TypeError) as exc:
        batch.encoded = None
        raise UnstorableBatch(
            f"run {clean_text(batch.run_id)}: a value in this write cannot be encoded ({exc})"
        ) from exc


def _key_values(batch: Batch) -> list[Any]:
    """What a batch's effects, outbox rows and approvals write besides text."""
    values: list[Any] = [json_text("effect result", e.result) for e in batch.effects]
    values += [e.step_no for e in batch.effects]
    values += [(o.step_no, json_text("outbox payload", o.payload)) for o in batch.outbox]
    values += [o.next_attempt_at for o in batch.outbox]
    values += [
        (a.step_no, json_text("approval arguments", a.arguments), a.requested_at)
        for a in batch.approvals
    ]
    values += [a.expires_at for a in batch.approvals]
    return values


def _check_flat(params: dict[str, Any]) -> None:
    """:func:`_check_numbers` for a statement's parameters (text, None and numbers)."""
    for value in params.values():
        kind = type(value)
        if kind is int:
            if not _INT64[0] <= value <= _INT64[1]:
                raise UnstorableValue(f"integer {value} does not fit in 64 bits")
        elif kind is float:
            if not isfinite(value):  # the message is check_finite's
                check_finite("a number", value)
        elif kind is not str and value is not None:
            _check_numbers(value)


def _check_numbers(value: Any) -> None:
    """Every integer fits in 64 bits and every float is finite (SQLite stores NaN as
    NULL, PostgreSQL sorts it above every time: a run parked "until NaN" never wakes)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise UnstorableValue(f"integer {value} does not fit in 64 bits")
    elif isinstance(value, float):
        check_finite("a number", value)
    elif isinstance(value, dict | list | tuple):
        # Recurse only where a number or a container can be: a batch's parameters are
        # mostly text and None, and a call per value made this check a tenth of a step.
        for v in value.values() if isinstance(value, dict) else value:
            if v is not None and not isinstance(v, str):
                _check_numbers(v)


STEP_COLUMNS = (
    "run_id, step_no, kind, name, status, input, input_hash, output, attempts, "
    "idempotency_key, started_at, duration_ms, tokens, cost_usd, error_class, error, lease_epoch"
)
STEP_UPSERT = (
    "ON CONFLICT (run_id, step_no) DO UPDATE SET "
    "status = excluded.status, input = excluded.input, input_hash = excluded.input_hash, "
    "output = excluded.output, attempts = excluded.attempts, "
    "idempotency_key = excluded.idempotency_key, started_at = excluded.started_at, "
    "duration_ms = excluded.duration_ms, tokens = excluded.tokens, "
    "cost_usd = excluded.cost_usd, error_class = excluded.error_class, "
    "error = excluded.error, lease_epoch = excluded.lease_epoch"
)


def step_params(step: Step) -> dict[str, Any]:
    """A journal entry as the parameters of its row (JSON columns encoded, text
    sanitized)."""
    return CleanParams(
        run_id=_clean(step.run_id),
        step_no=step.step_no,
        kind=_clean(step.kind),
        name=_clean(step.name),
        status=_clean(step.status),
        input=None if step.input is None else json_text("step input", step.input),
        input_hash=_clean(step.input_hash),
        output=None if step.output is None else json_text("step output", step.output),
        attempts=step.attempts,
        key=_clean(step.idempotency_key),
        started_at=step.started_at,
        duration_ms=step.duration_ms,
        tokens=step.tokens,
        cost_usd=step.cost_usd,
        error_class=_clean(step.error_class),
        error=_clean(step.error),
        lease_epoch=step.lease_epoch,
    )


def _clean(value: Any) -> Any:
    return clean_text(value) if type(value) is str else value


_STEP_INSERT = (
    f"INSERT INTO steps ({STEP_COLUMNS}) VALUES (:run_id, :step_no, :kind, :name, :status, "
    ":input, :input_hash, :output, :attempts, :key, :started_at, :duration_ms, :tokens, "
    f":cost_usd, :error_class, :error, :lease_epoch) {STEP_UPSERT}"
)


def write_effect(tx: Tx, effect: Effect) -> None:
    """Claim (status ``claimed``) or complete (``done``) an effect key."""
    params = {
        "key": effect.key,
        "run_id": effect.run_id,
        "step_no": effect.step_no,
        "status": effect.status,
        "result": dumps(effect.result),
        "now": time.time(),
    }
    if effect.status == EffectStatus.CLAIMED:
        found = tx.fetchall("SELECT * FROM effects WHERE key = :key", params)
        if found:
            existing = rows.effect_from(found[0])
            if (existing.run_id, existing.step_no) != (effect.run_id, effect.step_no):
                raise EffectClaimed(existing)
            return
        inserted = tx.execute(
            "INSERT INTO effects (key, run_id, step_no, status, result, updated_at) "
            "VALUES (:key, :run_id, :step_no, :status, :result, :now) "
            "ON CONFLICT (key) DO NOTHING",
            params,
        )
        if inserted == 0:  # another process claimed it since our SELECT (PostgreSQL)
            write_effect(tx, effect)
    else:
        tx.execute(
            "UPDATE effects SET status = :status, result = :result, updated_at = :now "
            "WHERE key = :key",
            params,
        )


def get_effect(tx: Tx, key: str) -> Effect | None:
    found = tx.fetchall("SELECT * FROM effects WHERE key = :key", {"key": key})
    return rows.effect_from(found[0]) if found else None
