"""The append-only audit trail."""

from __future__ import annotations

import functools
import time
from typing import Any

from agentledger.records import (
    Event,
    Step,
    dumps,
    loads,
)
from agentledger.store import _rows as rows
from agentledger.store._dialect import CleanParams
from agentledger.store._tx import Tx

# The events_type index leaves out the journal's step events (migration 0061): one
# index fewer written per journal write. A query by type states this condition (the
# index's own) so that both databases use the index.
EVENTS_TYPE_INDEXED = "type NOT LIKE 'step.%'"


def step_event_data(step: Step) -> dict[str, Any]:
    """The data of the ``step.<status>`` event of one journal write: every batch appends
    one per journal entry it writes (so a run's event stream describes its journal, in
    the same transaction; see ``journal.encode_batch``), before its own events. Being
    an event, it is sealed into the tenant's audit chain, so it carries what the audit
    trail must show of the step: the idempotency key it executed with, the policy
    decision that let it run, and its tokens and cost.

    One such event is stored per journal write, so it holds no key whose value the
    record already says: the status is its type's suffix, ``attempts`` is left out when
    it is 1 and ``error_class`` when there is none, and the key, policy, tokens and cost
    only when there is one (records written before carry every key)."""
    data: dict[str, Any] = {"step_no": step.step_no, "kind": step.kind, "name": step.name}
    if step.attempts != 1:
        data["attempts"] = step.attempts
    if step.error_class is not None:
        data["error_class"] = step.error_class
    if step.idempotency_key:
        data["key"] = step.idempotency_key
    if isinstance(step.input, dict) and isinstance(step.input.get("policy"), str):
        data["policy"] = step.input["policy"]
    if step.tokens:
        data["tokens"] = step.tokens
    if step.cost_usd:
        data["cost_usd"] = step.cost_usd
    return data


def insert_event(
    tx: Tx,
    run_id: str,
    type: str,
    actor: str,
    data: Any,
    seq: int | None = None,
    token: str | None = None,
) -> None:
    """Append an event. Its per-run ``seq`` comes from ``runs.event_seq``, bumped here under
    the run row's lock (or by the fence, which passes ``seq``): a run's events commit in
    seq order with no gaps, so a reader resuming after seq N misses none. ``token`` marks
    the job that wrote it (see :func:`has_event`)."""
    params = {"run_id": run_id, "at": time.time(), "type": type, "actor": actor}
    params["data"] = dumps(data)
    params["token"] = token
    if seq is None:
        tx.execute("UPDATE runs SET event_seq = event_seq + 1 WHERE id = :run_id", params)
        seq_sql = "(SELECT event_seq FROM runs WHERE id = :run_id)"
    else:
        params["seq"] = seq
        seq_sql = ":seq"
    tx.execute(
        "INSERT INTO events (run_id, at, type, actor, data, seq, token) VALUES (:run_id, :at, "
        f":type, :actor, :data, {seq_sql}, :token)",
        params,
    )


# Events per INSERT: a group's or a claim's events go in a few multi-row statements
# whose texts (one per row count) are made and compiled once.
EVENTS_PER_INSERT = 64


def insert_events(tx: Tx, events: list[tuple[str, int, str, str, Any]]) -> None:
    """Append events of several runs, each ``(run_id, seq, type, actor, data)`` with a
    seq its caller already took from ``runs.event_seq`` under the run row's lock in this
    transaction (the claim statement does), in multi-row INSERTs."""
    insert_encoded_events(
        tx,
        [(run_id, type_, actor, dumps(data), seq) for run_id, seq, type_, actor, data in events],
        clean=False,
    )


def insert_encoded_events(
    tx: Tx, events: list[tuple[str, str, str, str, int]], *, clean: bool = True
) -> None:
    """Append encoded events (run id, type, actor, data JSON, seq), of one run or of
    several, their seqs already taken under the runs' row locks, :data:`EVENTS_PER_INSERT`
    rows per statement.

    ``clean`` says the texts are already sanitized (the journal encodes its batches
    clean); otherwise the statement's parameters are sanitized on their way in."""
    at = time.time()
    for start in range(0, len(events), EVENTS_PER_INSERT):
        chunk = events[start : start + EVENTS_PER_INSERT]
        params: dict[str, Any] = CleanParams(at=at) if clean else {"at": at}
        for i, event in enumerate(chunk):
            params.update(zip(_event_names(i), event, strict=True))
        tx.execute(_events_sql(len(chunk)), params)


@functools.lru_cache(maxsize=EVENTS_PER_INSERT)
def _event_names(i: int) -> tuple[str, str, str, str, str]:
    """The parameter names of event ``i`` of an INSERT: run id, type, actor, data, seq."""
    return f"r{i}", f"t{i}", f"a{i}", f"d{i}", f"s{i}"


@functools.lru_cache(maxsize=EVENTS_PER_INSERT)
def _events_sql(n: int) -> str:
    values = ", ".join(f"(:r{i}, :at, :t{i}, :a{i}, :d{i}, :s{i})" for i in range(n))
    return f"INSERT INTO events (run_id, at, type, actor, data, seq) VALUES {values}"


def insert_tenant_event(
    tx: Tx, tenant_id: str, audit_id: str, type: str, actor: str, data: Any
) -> None:
    """Append an event under no run (a tenant's document changes, a user's memory
    changes), filed under ``audit_id`` (``docs/<tenant>``, ``memory/<tenant>/<user>``).

    It carries its tenant from the start, since there is no run row to find it by: the
    sealer chains it into that tenant's audit chain like a run's events. It has no
    ``seq`` (no run's stream to resume)."""
    tx.execute(
        "INSERT INTO events (run_id, tenant_id, at, type, actor, data) "
        "VALUES (:run_id, :tenant_id, :at, :type, :actor, :data)",
        {
            "run_id": audit_id,
            "tenant_id": tenant_id,
            "at": time.time(),
            "type": type,
            "actor": actor,
            "data": dumps(data),
        },
    )


def has_event(tx: Tx, run_id: str, token: str) -> bool:
    """True when a job with ``token`` appended an event to the run: the job committed
    before (its reply lost) and must not append it again."""
    found = tx.fetchall(
        "SELECT 1 AS found FROM events WHERE run_id = :run_id AND token = :token",
        {"run_id": run_id, "token": token},
    )
    return bool(found)


def event_data(tx: Tx, run_id: str, token: str, type: str) -> dict[str, Any] | None:
    """The data of the run's ``type`` event appended by a job with ``token`` (one that
    committed before its reply was lost: what it did), or None."""
    found = tx.fetchall(
        "SELECT data FROM events WHERE run_id = :run_id AND token = :token AND type = :type",
        {"run_id": run_id, "token": token, "type": type},
    )
    return (loads(found[0]["data"]) or {}) if found else None


def list_events(tx: Tx, run_id: str | None = None, after_id: int = 0) -> list[Event]:
    if run_id is None:
        sql = "SELECT * FROM events WHERE id > :after ORDER BY id LIMIT 1000"
    else:
        # events_run_seq finds the run's events; within a run seq and id grow together.
        sql = "SELECT * FROM events WHERE run_id = :run_id AND id > :after ORDER BY seq, id"
    found = tx.fetchall(sql, {"run_id": run_id, "after": after_id})
    return [rows.event_from(r) for r in found]
