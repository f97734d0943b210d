"""The SQL of agentledger, written once for every dialect.

Each function runs on one open connection inside a transaction the caller
manages (see :mod:`agentledger.store.sqlstore`). Placeholders are ``:name``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from agentledger.errors import LeaseLost, StoreError
from agentledger.records import (
    Approval,
    Effect,
    Event,
    OutboxItem,
    Run,
    RunStatus,
    Step,
    WorkerInfo,
    dumps,
    target_of,
)
from agentledger.store import rows
from agentledger.store.base import _UNSET, Batch, EffectClaimed, NewRun
from agentledger.store.dialect import Dialect

RUN_COLUMNS = (
    "id, tenant_id, user_id, kind, name, version, input, status, step_count, tokens, "
    "cost_usd, active_seconds, created_at, updated_at, lease_owner, lease_epoch, "
    "lease_expires_at, available_at, resumes, result, error, handover_reason"
)


def new_id(prefix: str = "") -> str:
    """A time-ordered id: milliseconds then randomness, so ids sort by creation."""
    return f"{prefix}{int(time.time() * 1000):011x}{secrets.token_hex(5)}"


# migrations ---------------------------------------------------------------


def migrate(d: Dialect, conn: Any) -> list[int]:
    """Apply every migration not yet applied; return the versions applied."""
    d.begin_write(conn)
    d.execute(
        conn,
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
        "applied_at DOUBLE PRECISION NOT NULL)",
    )
    done = {r["version"] for r in d.fetchall(conn, "SELECT version FROM schema_migrations")}
    applied = []
    for version, script in d.migrations():
        if version in done:
            continue
        for statement in d.split_script(script):
            d.execute(conn, statement)
        d.execute(
            conn,
            "INSERT INTO schema_migrations (version, applied_at) VALUES (:v, :t)",
            {"v": version, "t": time.time()},
        )
        applied.append(version)
    d.commit(conn)
    return applied


# runs -----------------------------------------------------------------------


def create_run(d: Dialect, conn: Any, new: NewRun) -> Run:
    now = time.time()
    run_id = new_id("r")
    params = {
        "id": run_id,
        "tenant_id": new.tenant_id,
        "user_id": new.user_id,
        "kind": new.kind,
        "name": new.name,
        "version": new.version,
        "target": target_of(new.name, new.version),
        "input": dumps(new.input),
        "status": RunStatus.QUEUED,
        "now": now,
        "available_at": new.available_at if new.available_at is not None else now,
    }
    d.execute(
        conn,
        "INSERT INTO runs (id, tenant_id, user_id, kind, name, version, target, input, status, "
        "created_at, updated_at, available_at) VALUES (:id, :tenant_id, :user_id, :kind, :name, "
        ":version, :target, :input, :status, :now, :now, :available_at)",
        params,
    )
    insert_event(d, conn, run_id, "run.submitted", new.user_id or "api", {"input": new.input})
    d.notify_runnable(conn)
    run = get_run(d, conn, run_id)
    assert run is not None
    return run


def get_run(d: Dialect, conn: Any, run_id: str) -> Run | None:
    found = d.fetchall(conn, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = :id", {"id": run_id})
    return rows.run_from(found[0]) if found else None


def list_runs(d: Dialect, conn: Any, status: str | None, name: str | None, limit: int) -> list[Run]:
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if status:
        where.append("status = :status")
        params["status"] = status
    if name:
        where.append("name = :name")
        params["name"] = name
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    sql = f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY created_at DESC LIMIT :limit"
    return [rows.run_from(r) for r in d.fetchall(conn, sql, params)]


def count_runs(d: Dialect, conn: Any) -> dict[str, int]:
    found = d.fetchall(conn, "SELECT status, COUNT(*) AS n FROM runs GROUP BY status")
    return {r["status"]: int(r["n"]) for r in found}


def claim_runs(
    d: Dialect, conn: Any, owner: str, targets: list[str], limit: int, lease_seconds: float
) -> list[Run]:
    if not targets or limit <= 0:
        return []
    now = time.time()
    params: dict[str, Any] = {
        "owner": owner,
        "now": now,
        "expires": now + lease_seconds,
        "limit": limit,
    }
    for i, target in enumerate(targets):
        params[f"t{i}"] = target
    found = d.fetchall(conn, d.claim_sql(len(targets)), params)
    claimed = [rows.run_from(r) for r in found]
    for run in claimed:
        insert_event(d, conn, run.id, "run.claimed", owner, {"epoch": run.lease_epoch})
    return claimed


def renew_leases(
    d: Dialect, conn: Any, owner: str, leases: dict[str, int], lease_seconds: float
) -> set[str]:
    expires = time.time() + lease_seconds
    lost = set()
    for run_id, epoch in leases.items():
        changed = d.execute(
            conn,
            "UPDATE runs SET lease_expires_at = :expires WHERE id = :id AND lease_epoch = :epoch "
            "AND lease_owner = :owner AND status = 'running'",
            {"expires": expires, "id": run_id, "epoch": epoch, "owner": owner},
        )
        if changed == 0:
            lost.add(run_id)
    return lost


def release_run(d: Dialect, conn: Any, run_id: str, epoch: int, owner: str) -> bool:
    changed = d.execute(
        conn,
        "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
        "available_at = :now, updated_at = :now WHERE id = :id AND lease_epoch = :epoch "
        "AND lease_owner = :owner AND status = 'running'",
        {"now": time.time(), "id": run_id, "epoch": epoch, "owner": owner},
    )
    if changed:
        insert_event(d, conn, run_id, "run.released", owner, {"epoch": epoch})
        d.notify_runnable(conn)
    return changed > 0


def expire_leases_of(d: Dialect, conn: Any, owners: list[str]) -> int:
    total = 0
    for owner in owners:
        total += d.execute(
            conn,
            "UPDATE runs SET lease_expires_at = 0 WHERE lease_owner = :owner "
            "AND status = 'running'",
            {"owner": owner},
        )
    return total


def lease_owners(d: Dialect, conn: Any) -> list[str]:
    found = d.fetchall(
        conn,
        "SELECT DISTINCT lease_owner FROM runs WHERE status = 'running' "
        "AND lease_owner IS NOT NULL AND lease_expires_at > :now",
        {"now": time.time()},
    )
    return [r["lease_owner"] for r in found]


def cancel_run(d: Dialect, conn: Any, run_id: str, reason: str, actor: str) -> Run:
    run = get_run(d, conn, run_id)
    if run is None:
        raise StoreError(f"no run {run_id}; list runs with `agentledger runs list`")
    if run.terminal:
        return run
    d.execute(
        conn,
        "UPDATE runs SET status = 'cancelled', error = :reason, lease_owner = NULL, "
        "lease_expires_at = NULL, available_at = NULL, lease_epoch = lease_epoch + 1, "
        "updated_at = :now WHERE id = :id",
        {"reason": reason, "now": time.time(), "id": run_id},
    )
    insert_event(d, conn, run_id, "run.cancelled", actor, {"reason": reason})
    run = get_run(d, conn, run_id)
    assert run is not None
    return run


# journal ----------------------------------------------------------------------


def load_journal(d: Dialect, conn: Any, run_id: str) -> list[Step]:
    found = d.fetchall(
        conn, "SELECT * FROM steps WHERE run_id = :id ORDER BY step_no", {"id": run_id}
    )
    return [rows.step_from(r) for r in found]


def fence_update(batch: Batch) -> tuple[str, dict[str, Any]]:
    """The fence: an UPDATE of the run row that matches only while the lease epoch
    and owner are the writer's (and the run is still running). Returns SQL, params."""
    sets = ["updated_at = :now"]
    params: dict[str, Any] = {
        "now": time.time(),
        "id": batch.run_id,
        "epoch": batch.epoch,
        "owner": batch.owner,
    }
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
            params["result"] = dumps(update.result)
        if update.status is not None and update.status != RunStatus.RUNNING:
            sets += ["status = :status", "lease_owner = NULL", "lease_expires_at = NULL"]
            sets.append("available_at = :available_at")
            params["status"] = update.status
            params["available_at"] = update.available_at
    sql = (
        f"UPDATE runs SET {', '.join(sets)} WHERE id = :id AND lease_epoch = :epoch "
        "AND lease_owner = :owner AND status = 'running'"
    )
    return sql, params


def apply_batch(d: Dialect, conn: Any, batch: Batch) -> None:
    """Apply one fenced batch: the fence first, then the batch's writes."""
    sql, params = fence_update(batch)
    if d.execute(conn, sql, params) == 0:
        raise LeaseLost(batch.run_id, batch.epoch)
    for step in batch.steps:
        upsert_step(d, conn, step)
    for effect in batch.effects:
        write_effect(d, conn, effect)
    for item in batch.outbox:
        insert_outbox(d, conn, item)
    for approval in batch.approvals:
        insert_approval(d, conn, approval)
    for event in batch.events:
        insert_event(d, conn, batch.run_id, event.type, event.actor, event.data)


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
        "input": None if step.input is None else dumps(step.input),
        "input_hash": step.input_hash,
        "output": None if step.output is None else dumps(step.output),
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


# events -----------------------------------------------------------------------


def insert_event(d: Dialect, conn: Any, run_id: str, type: str, actor: str, data: Any) -> None:
    d.execute(
        conn,
        "INSERT INTO events (run_id, at, type, actor, data) VALUES (:run_id, :at, :type, "
        ":actor, :data)",
        {"run_id": run_id, "at": time.time(), "type": type, "actor": actor, "data": dumps(data)},
    )


def list_events(d: Dialect, conn: Any, run_id: str | None, after_id: int) -> list[Event]:
    if run_id is None:
        sql = "SELECT * FROM events WHERE id > :after ORDER BY id LIMIT 1000"
    else:
        sql = "SELECT * FROM events WHERE run_id = :run_id AND id > :after ORDER BY id"
    found = d.fetchall(conn, sql, {"run_id": run_id, "after": after_id})
    return [rows.event_from(r) for r in found]


# approvals --------------------------------------------------------------------


def insert_approval(d: Dialect, conn: Any, a: Approval) -> None:
    d.execute(
        conn,
        "INSERT INTO approvals (id, run_id, step_no, tool, arguments, required_role, "
        "requested_at, expires_at, default_decision) VALUES (:id, :run_id, :step_no, :tool, "
        ":arguments, :role, :requested_at, :expires_at, :default) "
        "ON CONFLICT (run_id, step_no) DO NOTHING",
        {
            "id": a.id,
            "run_id": a.run_id,
            "step_no": a.step_no,
            "tool": a.tool,
            "arguments": dumps(a.arguments),
            "role": a.required_role,
            "requested_at": a.requested_at,
            "expires_at": a.expires_at,
            "default": a.default_decision,
        },
    )


def get_approvals(d: Dialect, conn: Any, run_id: str | None, pending: bool) -> list[Approval]:
    where, params = [], {}
    if run_id:
        where.append("run_id = :run_id")
        params["run_id"] = run_id
    if pending:
        where.append("decision IS NULL")
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    found = d.fetchall(conn, f"SELECT * FROM approvals {clause} ORDER BY requested_at", params)
    return [rows.approval_from(r) for r in found]


def decide_approval(
    d: Dialect, conn: Any, approval_id: str, decision: str, decided_by: str
) -> Approval:
    found = d.fetchall(conn, "SELECT * FROM approvals WHERE id = :id", {"id": approval_id})
    if not found:
        raise StoreError(f"no approval {approval_id}; list them with `agentledger approvals list`")
    approval = rows.approval_from(found[0])
    if approval.decision is not None:
        raise StoreError(f"approval {approval_id} was already decided: {approval.decision}")
    now = time.time()
    d.execute(
        conn,
        "UPDATE approvals SET decision = :decision, decided_by = :by, decided_at = :now "
        "WHERE id = :id AND decision IS NULL",
        {"decision": decision, "by": decided_by, "now": now, "id": approval_id},
    )
    # The decision re-queues the run: a worker picks it up and reads the decision.
    d.execute(
        conn,
        "UPDATE runs SET available_at = :now, updated_at = :now WHERE id = :run_id "
        "AND status = 'waiting'",
        {"now": now, "run_id": approval.run_id},
    )
    d.notify_runnable(conn)
    insert_event(
        d,
        conn,
        approval.run_id,
        "approval.decided",
        decided_by,
        {"approval_id": approval_id, "decision": decision, "tool": approval.tool},
    )
    approval.decision, approval.decided_by, approval.decided_at = decision, decided_by, now
    return approval


# outbox -----------------------------------------------------------------------


def insert_outbox(d: Dialect, conn: Any, item: OutboxItem) -> None:
    now = time.time()
    d.execute(
        conn,
        "INSERT INTO outbox (key, run_id, step_no, tool, payload, attempts, next_attempt_at, "
        "status, created_at, updated_at) VALUES (:key, :run_id, :step_no, :tool, :payload, 0, "
        ":next, 'pending', :now, :now) ON CONFLICT (key) DO NOTHING",
        {
            "key": item.key,
            "run_id": item.run_id,
            "step_no": item.step_no,
            "tool": item.tool,
            "payload": dumps(item.payload),
            "next": item.next_attempt_at or now,
            "now": now,
        },
    )


def claim_outbox(
    d: Dialect, conn: Any, owner: str, limit: int, lease_seconds: float
) -> list[OutboxItem]:
    now = time.time()
    found = d.fetchall(
        conn,
        "SELECT key FROM outbox WHERE status = 'pending' AND next_attempt_at <= :now "
        "AND (lease_expires_at IS NULL OR lease_expires_at < :now) "
        "ORDER BY next_attempt_at LIMIT :limit",
        {"now": now, "limit": limit},
    )
    claimed = []
    for r in found:
        got = d.fetchall(
            conn,
            "UPDATE outbox SET lease_owner = :owner, lease_expires_at = :exp WHERE key = :key "
            "AND (lease_expires_at IS NULL OR lease_expires_at < :now) RETURNING *",
            {"owner": owner, "exp": now + lease_seconds, "key": r["key"], "now": now},
        )
        claimed += [rows.outbox_from(g) for g in got]
    return claimed


def settle_outbox(d: Dialect, conn: Any, item: OutboxItem) -> None:
    d.execute(
        conn,
        "UPDATE outbox SET attempts = :attempts, status = :status, next_attempt_at = :next, "
        "last_error = :err, history = :history, lease_owner = NULL, lease_expires_at = NULL, "
        "updated_at = :now WHERE key = :key",
        {
            "attempts": item.attempts,
            "status": item.status,
            "next": item.next_attempt_at,
            "err": item.last_error,
            "history": dumps(item.history),
            "now": time.time(),
            "key": item.key,
        },
    )


def list_outbox(d: Dialect, conn: Any, status: str | None) -> list[OutboxItem]:
    if status:
        found = d.fetchall(
            conn, "SELECT * FROM outbox WHERE status = :s ORDER BY created_at", {"s": status}
        )
    else:
        found = d.fetchall(conn, "SELECT * FROM outbox ORDER BY created_at")
    return [rows.outbox_from(r) for r in found]


# workers ----------------------------------------------------------------------


def register_worker(d: Dialect, conn: Any, info: WorkerInfo, kinds: dict[str, str]) -> None:
    now = time.time()
    d.execute(
        conn,
        "INSERT INTO workers (id, host, pid, targets, started_at, heartbeat_at) VALUES "
        "(:id, :host, :pid, :targets, :now, :now) ON CONFLICT (id) DO UPDATE SET "
        "heartbeat_at = excluded.heartbeat_at",
        {
            "id": info.id,
            "host": info.host,
            "pid": info.pid,
            "targets": dumps(info.targets),
            "now": now,
        },
    )
    for target, kind in kinds.items():
        name, version = target.rsplit("@", 1)
        d.execute(
            conn,
            "INSERT INTO registrations (target, name, version, kind, registered_at) VALUES "
            "(:target, :name, :version, :kind, :now) ON CONFLICT (target) DO UPDATE SET "
            "registered_at = excluded.registered_at",
            {"target": target, "name": name, "version": version, "kind": kind, "now": now},
        )


def heartbeat_worker(d: Dialect, conn: Any, worker_id: str) -> None:
    d.execute(
        conn,
        "UPDATE workers SET heartbeat_at = :now WHERE id = :id",
        {"now": time.time(), "id": worker_id},
    )


def deregister_worker(d: Dialect, conn: Any, worker_id: str) -> None:
    d.execute(conn, "DELETE FROM workers WHERE id = :id", {"id": worker_id})


def list_workers(d: Dialect, conn: Any, live_within: float | None) -> list[WorkerInfo]:
    if live_within is None:
        found = d.fetchall(conn, "SELECT * FROM workers ORDER BY started_at")
    else:
        found = d.fetchall(
            conn,
            "SELECT * FROM workers WHERE heartbeat_at > :t ORDER BY started_at",
            {"t": time.time() - live_within},
        )
    return [rows.worker_from(r) for r in found]


def registrations(d: Dialect, conn: Any) -> list[dict[str, Any]]:
    return d.fetchall(
        conn, "SELECT target, name, version, kind, registered_at FROM registrations ORDER BY target"
    )
