"""The service's runs: submit with an Idempotency-Key and quotas, tenant-scoped reads.

A submit is ONE transaction: the quota check, the run row (via :func:`create_run`) and
the Idempotency-Key row, so a key never exists without its run nor a run without its key.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

from agentledger.errors import StoreError
from agentledger.records import RunStatus, dumps
from agentledger.store import rows
from agentledger.store.base import NewRun
from agentledger.store.dialect import Dialect
from agentledger.store.queries.common import RUN_COLUMNS
from agentledger.store.queries.events import insert_event
from agentledger.store.queries.runs import create_run, find_request, get_run
from agentledger.service.accepting import fast_path_fits, submit_fast
from agentledger.store.queries.service_quota import Quota, QuotaBook, QuotaExceeded
from agentledger.store.queries.service_submits import (
    IdempotencyMismatch,
    IdempotencyRequest,
    SubmitRequest,
    Submitted,
)

SERVICE_RUN_COLUMNS = RUN_COLUMNS + ", webhook, idempotency_key, event_seq"
# Re-exported: the quota and the submit's types are part of a submit.
__all__ = [
    "IdempotencyMismatch",
    "IdempotencyRequest",
    "Quota",
    "QuotaExceeded",
    "SubmitRequest",
    "Submitted",
]


def find_idempotent(
    d: Dialect, conn: Any, tenant_id: str, idem: IdempotencyRequest, now: float
) -> Submitted | None:
    """The run an earlier request with this key created (raises on a different body)."""
    found = d.fetchall(
        conn,
        "SELECT * FROM idempotency_keys WHERE tenant_id = :t AND key = :k AND expires_at > :now",
        {"t": tenant_id, "k": idem.key, "now": now},
    )
    if not found:
        return None
    row = found[0]
    if row["fingerprint"] != idem.fingerprint:
        raise IdempotencyMismatch(
            f"Idempotency-Key {idem.key!r} was used with a different request body"
        )
    run = get_run(d, conn, row["run_id"])
    if run is None:  # pragma: no cover - the key commits with its run
        raise StoreError(f"Idempotency-Key {idem.key!r} names a missing run")
    return Submitted(run, True, json.loads(row["response"]))


def submit_run(
    d: Dialect,
    conn: Any,
    new: NewRun,
    principal: dict[str, Any],
    webhook: str | None,
    idem: IdempotencyRequest | None,
    quota: Quota,
    respond: Any,
    request_id: str | None = None,
    book: QuotaBook | None = None,
) -> Submitted:
    """Create a run (one transaction: quota, run row, key row); replay a known key.

    ``respond(run)`` builds the response body recorded with the key, so a replay
    answers exactly what the first request answered. ``book`` is the quota state of a
    group commit (its tenants already locked and counted); alone, the submit makes its
    own.
    """
    now = time.time() if book is None else book.now
    if new.request_id is not None:
        # This very submit, committed before its reply was lost: answer it again, and
        # write nothing twice (a store retries a job after a lost connection). First:
        # its own Idempotency-Key row would answer it as a replay of another request.
        done = find_request(d, conn, new.request_id)
        if done is not None:
            return Submitted(done, False, respond(done))
    if idem is not None:
        earlier = find_idempotent(d, conn, new.tenant_id, idem, now)
        if earlier is not None:
            return earlier
    if book is None:
        book = QuotaBook(quota, now)
    book.check(d, conn, new.tenant_id)
    # The request id is not given to create_run: it was looked for just above, in this
    # transaction, and create_run would look again. It is written with the service
    # columns below, in the same transaction, under the same unique index.
    run = create_run(d, conn, dataclasses.replace(new, request_id=None))
    run = dataclasses.replace(run, request_id=new.request_id)
    # The service columns and the seq of the run.accepted event in one statement.
    seq = d.fetchall(
        conn,
        "UPDATE runs SET principal = :p, webhook = :w, idempotency_key = :k, "
        "request_id = :rid, event_seq = event_seq + 1 WHERE id = :id RETURNING event_seq",
        {
            "p": dumps(principal),
            "w": webhook,
            "k": idem.key if idem else None,
            "rid": new.request_id,
            "id": run.id,
        },
    )[0]["event_seq"]
    # Who started the run, in the audit trail with it.
    insert_event(
        d,
        conn,
        run.id,
        "run.accepted",
        str(principal.get("user_id")),
        {
            "key_id": principal.get("key_id"),
            "roles": principal.get("roles"),
            "request_id": request_id,
            "idempotency_key": idem.key if idem else None,
            "webhook": webhook,
        },
        seq=int(seq),
    )
    body = respond(run)
    if idem is not None:
        # An expired row of the same key is replaced. Only an expired one: a live row
        # committed by another process since our read above must make our INSERT fail
        # (unique violation; the caller retries and replays it), never be deleted.
        d.execute(
            conn,
            "DELETE FROM idempotency_keys WHERE tenant_id = :t AND key = :k AND expires_at <= :now",
            {"t": new.tenant_id, "k": idem.key, "now": now},
        )
        d.execute(
            conn,
            "INSERT INTO idempotency_keys (tenant_id, key, fingerprint, run_id, status_code, "
            "response, created_at, expires_at) VALUES (:t, :k, :f, :run, 202, :body, :now, "
            ":exp)",
            {
                "t": new.tenant_id,
                "k": idem.key,
                "f": idem.fingerprint,
                "run": run.id,
                "body": dumps(body),
                "now": now,
                "exp": now + idem.ttl_seconds,
            },
        )
    book.accepted(new.tenant_id)
    return Submitted(run, False, body)


def purge_idempotency_keys(d: Dialect, conn: Any, now: float) -> int:
    """Delete expired Idempotency-Key rows."""
    return d.execute(conn, "DELETE FROM idempotency_keys WHERE expires_at <= :now", {"now": now})


def service_run(d: Dialect, conn: Any, run_id: str, tenant_id: str) -> dict[str, Any] | None:
    """The run row with its service columns and pending approval, in ``tenant_id`` only."""
    found = d.fetchall(
        conn,
        f"SELECT {SERVICE_RUN_COLUMNS} FROM runs WHERE id = :id AND tenant_id = :t",
        {"id": run_id, "t": tenant_id},
    )
    if not found:
        return None
    return _with_approval(d, conn, found[0])


def _with_approval(d: Dialect, conn: Any, row: dict[str, Any]) -> dict[str, Any]:
    data = dict(row)
    data["run"] = rows.run_from(row)
    data["principal"] = json.loads(row["principal"]) if row.get("principal") else None
    pending = d.fetchall(
        conn,
        "SELECT * FROM approvals WHERE run_id = :id AND decision IS NULL ORDER BY step_no",
        {"id": row["id"]},
    )
    data["pending_approval"] = rows.approval_from(pending[0]) if pending else None
    return data


@dataclass
class RunFilter:
    """``GET /v1/runs`` filters; ``cursor`` is (created_at, id) of the last row seen."""

    tenant_id: str
    status: str | None = None
    agent: str | None = None
    version: str | None = None
    user: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    waiting_approval: bool | None = None
    needs_human: bool | None = None
    cursor: tuple[float, str] | None = None
    limit: int = 50


def list_service_runs(d: Dialect, conn: Any, f: RunFilter) -> list[dict[str, Any]]:
    """Runs of one tenant, newest first, after ``f.cursor``."""
    where = ["tenant_id = :tenant"]
    params: dict[str, Any] = {"tenant": f.tenant_id, "limit": f.limit}
    for column, value in (("status", f.status), ("name", f.agent), ("version", f.version),
                          ("user_id", f.user)):  # fmt: skip
        if value is not None:
            where.append(f"{column} = :{column}")
            params[column] = value
    if f.created_after is not None:
        where.append("created_at >= :after")
        params["after"] = f.created_after
    if f.created_before is not None:
        where.append("created_at < :before")
        params["before"] = f.created_before
    pending = "EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = runs.id AND a.decision IS NULL)"
    if f.waiting_approval is not None:
        where.append(pending if f.waiting_approval else f"NOT {pending}")
    if f.needs_human is not None:
        where.append("status = 'needs_human'" if f.needs_human else "status <> 'needs_human'")
    if f.cursor is not None:
        where.append("(created_at < :c_at OR (created_at = :c_at AND id < :c_id))")
        params["c_at"], params["c_id"] = f.cursor
    sql = (
        f"SELECT {SERVICE_RUN_COLUMNS} FROM runs WHERE {' AND '.join(where)} "
        "ORDER BY created_at DESC, id DESC LIMIT :limit"
    )
    return [_with_approval(d, conn, r) for r in d.fetchall(conn, sql, params)]


def run_steps(d: Dialect, conn: Any, run_id: str) -> list[dict[str, Any]]:
    """The journal of a run as rows (JSON columns decoded)."""
    found = d.fetchall(
        conn, "SELECT * FROM steps WHERE run_id = :id ORDER BY step_no", {"id": run_id}
    )
    return [rows.step_from(r).to_dict() for r in found]


def is_terminal(status: str) -> bool:
    """True for a status no transition leaves."""
    return status in RunStatus.TERMINAL


def submit_group(
    d: Dialect, conn: Any, requests: list[SubmitRequest]
) -> list[Submitted | BaseException]:
    """Many submits in ONE transaction (one fsync for the group), each under its own
    savepoint: a submit refused (quota, a reused key, a unique violation) is rolled back
    alone and its error returned in its place; the others commit.

    The group is first tried in a few statements for all of it
    (:mod:`agentledger.service.accepting`), with the same answers.

    The quota locks of the group's tenants are taken first, in tenant order, outside
    any savepoint (a savepoint rolled back would release a lock taken inside it).
    """
    out: list[Submitted | BaseException] = []
    if not requests:
        return out
    # One default quota per serve process: every request of a group carries the same.
    book = QuotaBook(requests[0].quota, time.time())
    book.prepare(d, conn, [r.new.tenant_id for r in requests])
    if fast_path_fits(requests):
        # The whole group in a few statements, under one savepoint. When a statement
        # fails (a key another process committed since the read, say) the savepoint
        # is rolled back and the group takes the per-request path below, with the
        # quota state as it was: there a refused submit fails alone.
        spare = copy.deepcopy(book)
        d.execute(conn, "SAVEPOINT submit_fast")
        try:
            done_all = submit_fast(d, conn, requests, book)
        except Exception as exc:
            if d.is_disconnect(exc) or d.is_transient(exc):
                raise  # the whole group is retried by the store
            d.execute(conn, "ROLLBACK TO SAVEPOINT submit_fast")
            d.execute(conn, "RELEASE SAVEPOINT submit_fast")
            book = spare
        else:
            d.execute(conn, "RELEASE SAVEPOINT submit_fast")
            return done_all
    for i, r in enumerate(requests):
        savepoint = f"submit{i}"
        d.execute(conn, f"SAVEPOINT {savepoint}")
        try:
            done = submit_run(
                d, conn, r.new, r.principal, r.webhook, r.idem, r.quota, r.respond,
                r.request_id, book,
            )  # fmt: skip
        except Exception as exc:
            if d.is_disconnect(exc) or d.is_transient(exc):
                raise  # the whole group is retried by the store
            d.execute(conn, f"ROLLBACK TO SAVEPOINT {savepoint}")
            d.execute(conn, f"RELEASE SAVEPOINT {savepoint}")
            out.append(exc)
            continue
        d.execute(conn, f"RELEASE SAVEPOINT {savepoint}")
        out.append(done)
    return out
