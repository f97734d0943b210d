"""Runs: submit, read, claim (lease + epoch), renew, release, expire, cancel."""

from __future__ import annotations

import time
from typing import Any

from agentledger._canonical import clean_text
from agentledger.errors import StoreError
from agentledger.records import (
    Run,
    RunStatus,
    dumps,
    target_of,
)
from agentledger.store import _rows as rows
from agentledger.store._base import NewRun
from agentledger.store._queries.common import (
    RUN_COLUMNS,
    check_lease,
    check_time,
    delay_of,
    json_text,
    new_id,
    new_token,
    status_literal,
)
from agentledger.store._queries.events import insert_event, insert_events
from agentledger.store._tx import Tx


def run_params(new: NewRun) -> dict[str, Any]:
    """A new run row's values (a fresh id), checked: raises on a bad time or input."""
    check_time("available_at", new.available_at)
    return {
        "id": new_id("r"),
        "tenant_id": new.tenant_id,
        "user_id": new.user_id,
        "kind": new.kind,
        "name": new.name,
        "version": new.version,
        "target": target_of(new.name, new.version),
        "input": json_text("input", new.input),
        "status": RunStatus.QUEUED,
        "available_in": delay_of(new.available_at),
        "request_id": new.request_id,
    }


def create_run(tx: Tx, new: NewRun) -> Run:
    """Insert a queued run; with a ``request_id`` already used, return that run instead.

    The request id is written in the same transaction with a unique index, so a submit
    retried after its COMMIT reply was lost finds the run the first attempt made.
    """
    params = run_params(new)
    actor, submitted = new.user_id or "api", {"input": new.input}
    now = tx.now
    # ON CONFLICT: a request id already used (a retried submit), or a second submitter
    # with the same id whose INSERT meets ours in flight (it waits for ours), inserts
    # nothing and returns the run the first made. The row comes back from the INSERT,
    # which also takes the seq (1) of its ``run.submitted`` event: nothing is looked up
    # first, bumped or read back, and where the dialect can, the run, its event and the
    # hint to idle workers are one statement (on a server, each is a round trip).
    insert_run = (
        "INSERT INTO runs (id, tenant_id, user_id, kind, name, version, target, input, status, "
        "created_at, updated_at, available_at, request_id, event_seq) VALUES (:id, :tenant_id, "
        f":user_id, :kind, :name, :version, :target, :input, :status, {now}, {now}, "
        f"{now} + COALESCE(:available_in, 0), :request_id, 1) "
        f"ON CONFLICT (request_id) DO NOTHING RETURNING {RUN_COLUMNS}"
    )
    one = tx.dialect.submit_sql(insert_run, _SUBMITTED_FROM_RUN)
    if one is not None:
        params.update(actor=actor, data=dumps(submitted), at=time.time())
    inserted = tx.fetchall(one if one is not None else insert_run, params)
    if not inserted:
        existing = find_request(tx, new.request_id) if new.request_id is not None else None
        if existing is None:
            raise StoreError(f"submit {clean_text(str(new.request_id))!r} conflicted and vanished")
        return existing
    if one is None:
        insert_event(tx, params["id"], "run.submitted", actor, submitted, seq=1)
        tx.dialect.notify_runnable(tx.conn)
    return rows.run_from(inserted[0])


# A new run's first event, seq 1 (the run row is inserted with ``event_seq`` 1), in one
# statement with the run's INSERT (``Dialect.submit_sql``); typed, since an INSERT ...
# SELECT does not take its values' types from the table.
_SUBMITTED_FROM_RUN = (
    "INSERT INTO events (run_id, at, type, actor, data, seq) SELECT run.id, "
    "CAST(:at AS DOUBLE PRECISION), 'run.submitted', CAST(:actor AS TEXT), "
    "CAST(:data AS TEXT), 1 FROM run"
)


def find_request(tx: Tx, request_id: str) -> Run | None:
    """The run a submit with this request id created, if any."""
    found = tx.fetchall(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE request_id = :rid", {"rid": request_id}
    )
    return rows.run_from(found[0]) if found else None


def get_run(tx: Tx, run_id: str) -> Run | None:
    found = tx.fetchall(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = :id", {"id": run_id})
    return rows.run_from(found[0]) if found else None


def list_runs(
    tx: Tx, status: str | None = None, name: str | None = None, limit: int = 100
) -> list[Run]:
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if status:
        where.append(f"status = {status_literal(status)}")
    if name:
        where.append("name = :name")
        params["name"] = name
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    sql = f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY created_at DESC LIMIT :limit"
    return [rows.run_from(r) for r in tx.fetchall(sql, params)]


def count_runs(tx: Tx) -> dict[str, int]:
    found = tx.fetchall("SELECT status, COUNT(*) AS n FROM runs GROUP BY status")
    return {r["status"]: int(r["n"]) for r in found}


def claim_runs(
    tx: Tx,
    owner: str,
    targets: list[str],
    limit: int,
    lease_seconds: float,
    token: str = "",
) -> list[Run]:
    """Claim runnable runs, judged by the database's clock (:attr:`Dialect.now_sql`)."""
    check_lease(lease_seconds)
    if not targets or limit <= 0:
        return []
    params: dict[str, Any] = {
        "owner": owner,
        "lease": float(lease_seconds),
        "limit": limit,
        "token": token or new_token(),
    }
    for i, target in enumerate(targets):
        params[f"t{i}"] = target
    found = tx.fetchall(tx.dialect.claim_sql(len(targets)), params)
    # The claim statement took each run's event seq under its row lock: the claim's
    # events are one statement, not two per run inside the claiming transaction.
    insert_events(
        tx,
        [
            (str(r["id"]), int(r["event_seq"]), "run.claimed", owner, {"epoch": r["lease_epoch"]})
            for r in found
        ],
    )
    return [rows.run_from(r) for r in found]


def claimed_with(tx: Tx, owner: str, token: str) -> list[Run] | None:
    """The runs a claim with ``token`` took (a claim retried after a lost COMMIT reply),
    or None when that claim did not commit."""
    found = tx.fetchall(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE write_token = :token AND lease_owner = :owner "
        "AND status = 'running'",
        {"token": token, "owner": owner},
    )
    return [rows.run_from(r) for r in found] or None


def renew_leases(tx: Tx, owner: str, leases: dict[str, int], lease_seconds: float) -> set[str]:
    """Renew every lease of ``leases`` (run id -> epoch) that ``owner`` still holds at
    that epoch on a running run, to the database's now + ``lease_seconds``; return the
    ids of the others (lost: taken over, given back, finished or gone).

    ONE statement however many runs: it locks the rows it renews one by one in id order,
    the order of the journal's group commits and of the reapers, so a heartbeat never
    deadlocks with them, and holds them for one round trip, not one per run."""
    check_lease(lease_seconds)
    # Each lease as the row would hold it (clean text); an epoch past 64 bits matches no
    # row (no column holds one): lost, never sent.
    asked = {run_id: (clean_text(run_id), epoch) for run_id, epoch in leases.items()}
    pairs = [pair for pair in asked.values() if -(2**63) <= pair[1] < 2**63]
    if not pairs:
        return set(leases)
    table, params = tx.dialect.id_epochs(pairs)
    params.update(lease=float(lease_seconds), owner=owner)
    renewed = tx.fetchall(
        f"UPDATE runs SET lease_expires_at = {tx.now} + :lease FROM ("
        "SELECT r.id AS held_id, r.lease_epoch AS held_epoch FROM runs r "
        f"JOIN {table} ON r.id = pairs.id AND r.lease_epoch = pairs.epoch "
        "WHERE r.lease_owner = :owner AND r.status = 'running' "
        f"ORDER BY r.id{tx.dialect.lock_rows('r')}) AS held "
        "WHERE runs.id = held.held_id AND runs.lease_epoch = held.held_epoch "
        "AND runs.lease_owner = :owner AND runs.status = 'running' "
        "RETURNING runs.id, runs.lease_epoch",
        params,
    )
    held = {(row["id"], row["lease_epoch"]) for row in renewed}
    return {run_id for run_id, pair in asked.items() if pair not in held}


def release_run(tx: Tx, run_id: str, epoch: int, owner: str, token: str | None = None) -> bool:
    """Give the run back (queued, lease cleared), fenced by epoch and owner. ``token``
    marks its ``run.released`` event: a release retried after a lost reply finds it
    (see :func:`agentledger.store._queries.events.has_event`) and answers True."""
    now = tx.now
    changed = tx.execute(
        "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
        f"available_at = {now}, updated_at = {now} WHERE id = :id AND lease_epoch = :epoch "
        "AND lease_owner = :owner AND status = 'running'",
        {"id": run_id, "epoch": epoch, "owner": owner},
    )
    if changed:
        insert_event(tx, run_id, "run.released", owner, {"epoch": epoch}, token=token)
        tx.dialect.notify_runnable(tx.conn)
    return changed > 0


def expire_leases_of(tx: Tx, owners: list[str]) -> int:
    # Several workers may reap the same dead owner at once: take its rows in id
    # order and skip the ones another reaper holds, so two reapers never deadlock.
    total = 0
    for owner in sorted(owners):
        total += tx.execute(
            "UPDATE runs SET lease_expires_at = 0 WHERE id IN (SELECT id FROM runs "
            "WHERE lease_owner = :owner AND status = 'running' ORDER BY id"
            f"{tx.dialect.skip_locked})",
            {"owner": owner},
        )
    return total


def lease_owners(tx: Tx) -> list[str]:
    found = tx.fetchall(
        "SELECT DISTINCT lease_owner FROM runs WHERE status = 'running' "
        f"AND lease_owner IS NOT NULL AND lease_expires_at > {tx.now}",
    )
    return [r["lease_owner"] for r in found]


_TERMINAL = ", ".join(f"'{s}'" for s in sorted(RunStatus.TERMINAL))


def cancel_run(tx: Tx, run_id: str, reason: str, actor: str) -> Run:
    """Request the cancel of a run (the protocol is in docs/architecture.md, "Cancel").

    Never bumps the lease epoch, and never overwrites a terminal state: every change
    is one guarded UPDATE whose row count says whether it happened, so a cancel racing
    the run's final commit leaves ``completed`` as it is.
    """
    run = get_run(tx, run_id)
    if run is None:
        raise StoreError(f"no run {clean_text(run_id)!r}; list runs with `agentledger runs list`")
    if run.terminal:
        return run
    now = tx.now
    # A queued run that never started: nothing to compensate, cancelled at once.
    cancelled = tx.execute(
        "UPDATE runs SET status = 'cancelled', error = :reason, cancel_requested = :reason, "
        "lease_owner = NULL, lease_expires_at = NULL, available_at = NULL, "
        f"updated_at = {now} WHERE id = :id AND status = 'queued' AND step_count = 0 "
        "AND lease_owner IS NULL AND NOT EXISTS (SELECT 1 FROM steps WHERE run_id = :id)",
        {"reason": reason, "id": run_id},
    )
    if cancelled:
        insert_event(tx, run_id, "run.cancelled", actor, {"reason": reason})
    elif run.cancel_requested is None or run.status in (RunStatus.QUEUED, RunStatus.WAITING):
        # Any other live run: a request its worker honours at the next step boundary.
        # A parked run is made claimable now, so that a worker picks the request up.
        requested = tx.execute(
            "UPDATE runs SET cancel_requested = COALESCE(cancel_requested, :reason), "
            "status = CASE WHEN status IN ('queued', 'waiting') THEN 'queued' ELSE status END, "
            "available_at = CASE WHEN status IN ('queued', 'waiting') "
            f"THEN {now} ELSE available_at END, updated_at = {now} "
            f"WHERE id = :id AND status NOT IN ({_TERMINAL})",
            {"reason": reason, "id": run_id},
        )
        if requested and run.cancel_requested is None:
            insert_event(tx, run_id, "run.cancel_requested", actor, {"reason": reason})
        if requested:
            tx.dialect.notify_runnable(tx.conn)
    run = get_run(tx, run_id)
    assert run is not None
    return run


def cancel_requests(tx: Tx, run_ids: list[str]) -> dict[str, str]:
    """Run id -> reason, for those of ``run_ids`` that have a cancel request.

    One statement however many ids (a heartbeat asks for every lease it renewed): they
    ride in one parameter, never one each, which PostgreSQL caps at 65,535."""
    if not run_ids:
        return {}
    asked = {run_id: clean_text(run_id) for run_id in run_ids}
    among, params = tx.dialect.among("id", sorted(set(asked.values())))
    found = tx.fetchall(
        f"SELECT id, cancel_requested FROM runs WHERE {among} AND cancel_requested IS NOT NULL",
        params,
    )
    reasons = {row["id"]: row["cancel_requested"] for row in found}
    return {run_id: reasons[row_id] for run_id, row_id in asked.items() if row_id in reasons}
