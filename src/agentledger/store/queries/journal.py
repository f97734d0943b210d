"""The journal: fenced batches (the fence, step rows, effects) and reading it back."""

from __future__ import annotations

import time
from typing import Any

from agentledger.canonical import clean_text
from agentledger.errors import LeaseLost
from agentledger.records import (
    Effect,
    RunStatus,
    Step,
    dumps,
)
from agentledger.store import rows
from agentledger.store.base import (
    _UNSET,
    Batch,
    EffectClaimed,
    NewEvent,
    UnstorableBatch,
    UnstorableValue,
)
from agentledger.store.dialect import Dialect
from agentledger.store.queries.approvals import insert_approval
from agentledger.store.queries.common import check_finite, check_time, delay_of, json_text
from agentledger.store.queries.events import batch_events
from agentledger.store.queries.outbox import drop_outbox, insert_outbox


def load_journal(d: Dialect, conn: Any, run_id: str) -> list[Step]:
    found = d.fetchall(
        conn, "SELECT * FROM steps WHERE run_id = :id ORDER BY step_no", {"id": run_id}
    )
    return [rows.step_from(r) for r in found]


def fence_update(batch: Batch, now_sql: str = ":now") -> tuple[str, dict[str, Any]]:
    """The fence: an UPDATE of the run row that matches only while the lease epoch
    and owner are the writer's (and the run is still running). Returns SQL, params.

    ``now_sql`` is the dialect's clock (:attr:`Dialect.now_sql`): a park time is written
    as the database's now plus the delay the writer meant (see ``common.delay_of``)."""
    sets = [f"updated_at = {now_sql}", "write_token = :token"]
    params: dict[str, Any] = {
        "now": time.time(),
        "id": batch.run_id,
        "epoch": batch.epoch,
        "owner": batch.owner,
        "token": batch.token,
    }
    n_events = len(batch_events(batch))
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
        for name in ("error", "handover_reason"):
            value = getattr(update, name)
            if value is not _UNSET:
                sets.append(f"{name} = :{name}")
                params[name] = value
        if update.result is not _UNSET:
            sets.append("result = :result")
            params["result"] = json_text("result", update.result)
        if update.status is not None and update.status != RunStatus.RUNNING:
            sets += ["status = :status", "lease_owner = NULL", "lease_expires_at = NULL"]
            sets.append(f"available_at = {now_sql} + :available_in")
            params["status"] = update.status
            params["available_in"] = delay_of(update.available_at)
    sql = (
        f"UPDATE runs SET {', '.join(sets)} WHERE id = :id AND lease_epoch = :epoch "
        "AND lease_owner = :owner AND status = 'running'"
    )
    return sql, params


def apply_batch(d: Dialect, conn: Any, batch: Batch) -> None:
    """Apply one fenced batch: the fence first, then the batch's writes."""
    sql, params = fence_update(batch, d.now_sql)
    events = batch_events(batch)
    # The fence hands back the seqs it took (no second statement to read them) and the
    # run's cancel request (the engine stops at its next step boundary: Batch).
    found = d.fetchall(conn, sql + " RETURNING event_seq, cancel_requested", params)
    if not found:
        raise LeaseLost(batch.run_id, batch.epoch)
    last_seq = int(found[0]["event_seq"])
    batch.cancel_requested = found[0]["cancel_requested"]
    for step in batch.steps:
        upsert_step(d, conn, step)
    for effect in batch.effects:
        write_effect(d, conn, effect)
    for item in batch.outbox:
        insert_outbox(d, conn, item)
    for approval in batch.approvals:
        insert_approval(d, conn, approval)
    if batch.drop_outbox:
        drop_outbox(d, conn, batch.run_id, "compensation began")
    if events:
        insert_events(d, conn, batch.run_id, events, last_seq - len(events) + 1)


def insert_events(d: Dialect, conn: Any, run_id: str, events: list[NewEvent], first: int) -> None:
    """A batch's events as ONE multi-row INSERT, with the seqs ``first``, ``first + 1``, ...
    that the fence took for them (one statement instead of one per event)."""
    params: dict[str, Any] = {"run_id": run_id, "at": time.time()}
    values = []
    for i, event in enumerate(events):
        params[f"t{i}"], params[f"a{i}"] = event.type, event.actor
        params[f"d{i}"], params[f"s{i}"] = dumps(event.data), first + i
        values.append(f"(:run_id, :at, :t{i}, :a{i}, :d{i}, :s{i})")
    d.execute(
        conn,
        f"INSERT INTO events (run_id, at, type, actor, data, seq) VALUES {', '.join(values)}",
        params,
    )


def committed(d: Dialect, conn: Any, batches: list[Batch]) -> set[str]:
    """The tokens of those ``batches`` that are already committed.

    Asked before a write is retried after a lost connection: the fence writes the
    batch's token on its run row, so a batch whose COMMIT reply was lost is found
    here and not applied (nor answered "lease lost") a second time.
    """
    if not batches:
        return set()
    params = {f"r{i}": b.run_id for i, b in enumerate(batches)}
    marks = ", ".join(f":{k}" for k in params)
    found = d.fetchall(conn, f"SELECT write_token FROM runs WHERE id IN ({marks})", params)
    tokens = {r["write_token"] for r in found}
    return {b.token for b in batches if b.token in tokens}


_INT64 = (-(2**63), 2**63 - 1)


def validate_batch(batch: Batch) -> None:
    """Encode everything ``batch`` writes, before it joins a group: a batch no database
    can store (an integer past 64 bits, JSON nested too deep to encode) is refused alone
    with :class:`UnstorableBatch`, and never fails the batches committed with it.
    Text needs no check here: every parameter is sanitized on its way to the driver."""
    try:
        update = batch.run
        if update is not None:
            check_time("available_at", update.available_at)
        params: list[Any] = [fence_update(batch)[1]]
        params += [step_params(s) for s in batch.steps]
        params += [json_text("effect result", e.result) for e in batch.effects]
        params += [e.step_no for e in batch.effects]
        params += [(o.step_no, json_text("outbox payload", o.payload)) for o in batch.outbox]
        params += [o.next_attempt_at for o in batch.outbox]
        params += [
            (a.step_no, json_text("approval arguments", a.arguments), a.requested_at)
            for a in batch.approvals
        ]
        params += [a.expires_at for a in batch.approvals]
        params += [json_text("event data", e.data) for e in batch_events(batch)]
        _check_numbers(params)
    except UnstorableValue as exc:
        raise UnstorableBatch(f"run {clean_text(batch.run_id)}: {exc}") from exc
    except (RecursionError, ValueError, TypeError) as exc:
        raise UnstorableBatch(
            f"run {clean_text(batch.run_id)}: a value in this write cannot be encoded ({exc})"
        ) from exc


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
    """A journal entry as the parameters of its row (JSON columns encoded)."""
    return {
        "run_id": step.run_id,
        "step_no": step.step_no,
        "kind": step.kind,
        "name": step.name,
        "status": step.status,
        "input": None if step.input is None else json_text("step input", step.input),
        "input_hash": step.input_hash,
        "output": None if step.output is None else json_text("step output", step.output),
        "attempts": step.attempts,
        "key": step.idempotency_key,
        "started_at": step.started_at,
        "duration_ms": step.duration_ms,
        "tokens": step.tokens,
        "cost_usd": step.cost_usd,
        "error_class": step.error_class,
        "error": step.error,
        "lease_epoch": step.lease_epoch,
    }


def upsert_step(d: Dialect, conn: Any, step: Step) -> None:
    params = step_params(step)
    d.execute(
        conn,
        f"INSERT INTO steps ({STEP_COLUMNS}) VALUES (:run_id, :step_no, :kind, :name, :status, "
        ":input, :input_hash, :output, :attempts, :key, :started_at, :duration_ms, :tokens, "
        f":cost_usd, :error_class, :error, :lease_epoch) {STEP_UPSERT}",
        params,
    )


def write_effect(d: Dialect, conn: Any, effect: Effect) -> None:
    """Claim (status ``claimed``) or complete (``done``) an effect key."""
    params = {
        "key": effect.key,
        "run_id": effect.run_id,
        "step_no": effect.step_no,
        "status": effect.status,
        "result": dumps(effect.result),
        "now": time.time(),
    }
    if effect.status == "claimed":
        found = d.fetchall(conn, "SELECT * FROM effects WHERE key = :key", params)
        if found:
            existing = rows.effect_from(found[0])
            if (existing.run_id, existing.step_no) != (effect.run_id, effect.step_no):
                raise EffectClaimed(existing)
            return
        inserted = d.execute(
            conn,
            "INSERT INTO effects (key, run_id, step_no, status, result, updated_at) "
            "VALUES (:key, :run_id, :step_no, :status, :result, :now) "
            "ON CONFLICT (key) DO NOTHING",
            params,
        )
        if inserted == 0:  # another process claimed it since our SELECT (PostgreSQL)
            write_effect(d, conn, effect)
    else:
        d.execute(
            conn,
            "UPDATE effects SET status = :status, result = :result, updated_at = :now "
            "WHERE key = :key",
            params,
        )


def get_effect(d: Dialect, conn: Any, key: str) -> Effect | None:
    found = d.fetchall(conn, "SELECT * FROM effects WHERE key = :key", {"key": key})
    return rows.effect_from(found[0]) if found else None
