"""Runs: submit, read, claim (lease + epoch), renew, release, expire, cancel."""

from __future__ import annotations

import time
from typing import Any

from agentledger.errors import StoreError
from agentledger.records import (
    Run,
    RunStatus,
    dumps,
    target_of,
)
from agentledger.store import rows
from agentledger.store.base import NewRun
from agentledger.store.dialect import Dialect
from agentledger.store.queries.common import RUN_COLUMNS, new_id
from agentledger.store.queries.events import insert_event


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
    for run_id, epoch in sorted(leases.items()):  # row locks in id order, like commits
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
    # Several workers may reap the same dead owner at once: take its rows in id
    # order and skip the ones another reaper holds, so two reapers never deadlock.
    total = 0
    for owner in sorted(owners):
        total += d.execute(
            conn,
            "UPDATE runs SET lease_expires_at = 0 WHERE id IN (SELECT id FROM runs "
            "WHERE lease_owner = :owner AND status = 'running' ORDER BY id"
            f"{d.skip_locked})",
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
