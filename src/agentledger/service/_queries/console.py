"""The web console's SQL: its sign-in sessions, the filtered runs list and the reads
behind a run's page (service/_console/)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from agentledger.records import RunStatus
from agentledger.store import _rows as rows
from agentledger.store._queries.common import RUN_COLUMNS
from agentledger.store._queries.events import insert_event
from agentledger.store._queries.service_runs import run_where
from agentledger.store._tx import Tx

# sessions ------------------------------------------------------------------------------


def insert_session(
    tx: Tx,
    id_hash: str,
    key_id: str,
    tenant_id: str,
    user_id: str,
    roles: list[str],
    csrf: str,
    now: float,
    expires_at: float,
) -> None:
    """Store a new session (the SHA-256 of its id, never the id)."""
    tx.execute(
        "INSERT INTO console_sessions (id_hash, key_id, tenant_id, user_id, roles, csrf, "
        "created_at, expires_at) VALUES (:h, :k, :t, :u, :r, :c, :now, :exp)",
        {
            "h": id_hash, "k": key_id, "t": tenant_id, "u": user_id,
            "r": json.dumps(sorted(roles)), "c": csrf, "now": now, "exp": expires_at,
        },
    )  # fmt: skip


def get_session(tx: Tx, id_hash: str) -> dict[str, Any] | None:
    """The session row of ``id_hash`` (roles decoded), revoked or expired ones included."""
    found = tx.fetchall("SELECT * FROM console_sessions WHERE id_hash = :h", {"h": id_hash})
    if not found:
        return None
    row = dict(found[0])
    row["roles"] = json.loads(row["roles"])
    return row


def touch_session(tx: Tx, id_hash: str, now: float) -> None:
    """The session's browser made a request at ``now`` (its idle clock starts again)."""
    tx.execute(
        "UPDATE console_sessions SET last_seen_at = :now WHERE id_hash = :h AND revoked_at IS NULL",
        {"h": id_hash, "now": now},
    )


def revoke_session(tx: Tx, id_hash: str, now: float) -> bool:
    """End a session; False when it was not live."""
    return bool(
        tx.execute(
            "UPDATE console_sessions SET revoked_at = :now WHERE id_hash = :h "
            "AND revoked_at IS NULL",
            {"h": id_hash, "now": now},
        )
    )


def purge_sessions(tx: Tx, before: float) -> int:
    """Delete sessions that expired before ``before``."""
    return int(tx.execute("DELETE FROM console_sessions WHERE expires_at < :b", {"b": before}) or 0)


# the runs list -----------------------------------------------------------------------

#: Statuses the console filters by beyond the stored ones: a view over the run and its
#: steps, approvals and stuck mark.
DERIVED_STATUSES = ("waiting_approval", "retrying", "stuck")
STATUSES: tuple[str, ...] = (*RunStatus.ALL, *DERIVED_STATUSES)

_PENDING = "EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = runs.id AND a.decision IS NULL)"
_RETRYING = "EXISTS (SELECT 1 FROM steps s WHERE s.run_id = runs.id AND s.status = 'retrying')"
# Attempts past the first, over the run's steps (the steps' primary key is the index).
_RETRIES = (
    "(SELECT COALESCE(SUM(s.attempts - 1), 0) FROM steps s WHERE s.run_id = runs.id "
    "AND s.attempts > 1)"
)


@dataclass
class ConsoleFilter:
    """What the runs page filters by (all from the URL's query)."""

    tenant_id: str
    status: str | None = None
    agent: str | None = None
    version: str | None = None
    user: str | None = None
    error_class: str | None = None
    min_retries: int | None = None
    cost_min: float | None = None
    cost_max: float | None = None
    idempotency_key: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    cursor: tuple[float, str] | None = None
    limit: int = 50


def _where(f: ConsoleFilter) -> tuple[list[str], dict[str, Any]]:
    stored = f.status if f.status not in DERIVED_STATUSES else None
    where, params = run_where(
        f.tenant_id,
        status=stored,
        agent=f.agent,
        version=f.version,
        user=f.user,
        created_after=f.created_after,
        created_before=f.created_before,
        cursor=f.cursor,
    )
    if f.idempotency_key is not None:
        where.append("idempotency_key = :idempotency_key")
        params["idempotency_key"] = f.idempotency_key
    if f.status == "waiting_approval":
        where.append(f"status = 'waiting' AND {_PENDING}")
    elif f.status == "retrying":
        where.append(f"status IN ('queued', 'waiting') AND {_RETRYING}")
    elif f.status == "stuck":
        terminal = ", ".join(f"'{s}'" for s in sorted(RunStatus.TERMINAL))
        where.append(f"stuck_mark IS NOT NULL AND status NOT IN ({terminal})")
    if f.error_class is not None:
        where.append(
            "(handover_reason = :ec OR EXISTS (SELECT 1 FROM steps s WHERE s.run_id = runs.id "
            "AND s.error_class = :ec))"
        )
        params["ec"] = f.error_class
    if f.min_retries is not None:
        where.append(f"{_RETRIES} >= :min_retries")
        params["min_retries"] = f.min_retries
    if f.cost_min is not None:
        where.append("cost_usd >= :cost_min")
        params["cost_min"] = f.cost_min
    if f.cost_max is not None:
        where.append("cost_usd <= :cost_max")
        params["cost_max"] = f.cost_max
    return where, params


def list_runs(tx: Tx, f: ConsoleFilter) -> list[dict[str, Any]]:
    """One page of the tenant's runs, newest first, after ``f.cursor``: keyset over
    (created_at, id), which the ``runs_tenant_created`` index serves however many runs
    the tenant has. Each row: the run, whether an approval waits, its retries."""
    where, params = _where(f)
    params["limit"] = f.limit
    sql = (
        f"SELECT {RUN_COLUMNS}, event_seq, stuck_mark, idempotency_key, "
        f"CASE WHEN {_PENDING} THEN 1 ELSE 0 END AS pending_approval, "
        f"{_RETRIES} AS retries FROM runs WHERE {' AND '.join(where)} "
        "ORDER BY created_at DESC, id DESC LIMIT :limit"
    )
    out = []
    for r in tx.fetchall(sql, params):
        out.append(
            {
                "run": rows.run_from(r),
                "event_seq": int(r["event_seq"]),
                "stuck": r["stuck_mark"] is not None,
                "pending_approval": bool(r["pending_approval"]),
                "retries": int(r["retries"] or 0),
                "idempotency_key": r["idempotency_key"],
            }
        )
    return out


def runs_matching(
    tx: Tx, f: ConsoleFilter, run_ids: list[str], floor: tuple[float, str] | None
) -> list[str]:
    """Which of ``run_ids`` the page ``f`` shows could take in now: those that match its
    filter (the list's own conditions, cursor included) and are not older than
    ``floor``, the oldest row of a full page. By the runs' primary key, however rare
    the filter: the live list asks it about the runs whose events it just read."""
    if not run_ids:
        return []
    where, params = _where(f)
    marks = []
    for i, run_id in enumerate(run_ids):
        params[f"id{i}"] = run_id
        marks.append(f":id{i}")
    if floor is not None:
        where.append("(created_at > :floor_at OR (created_at = :floor_at AND id >= :floor_id))")
        params["floor_at"], params["floor_id"] = floor
    # The runs are found by their primary key first (a materialized CTE: neither
    # planner may merge it), then the list's conditions judge those few rows. Merged
    # into one WHERE, both planners may prefer the tenant's index for the list's
    # ``tenant_id = :tenant`` and walk every run of the tenant.
    found = tx.fetchall(
        f"WITH picked AS MATERIALIZED (SELECT * FROM runs WHERE id IN ({', '.join(marks)})) "
        f"SELECT id FROM picked AS runs WHERE {' AND '.join(where)}",
        params,
    )
    return [r["id"] for r in found]


# a run's page ------------------------------------------------------------------------


def run_story(tx: Tx, run_id: str, events_limit: int = 500) -> dict[str, Any]:
    """What a run's page shows beside the run row: its journal, approvals, outbox rows,
    effects-table rows and (the latest ``events_limit``) events, in one read."""
    steps = [
        rows.step_from(r)
        for r in tx.fetchall(
            "SELECT * FROM steps WHERE run_id = :id ORDER BY step_no", {"id": run_id}
        )
    ]
    approvals = [
        rows.approval_from(r)
        for r in tx.fetchall(
            "SELECT * FROM approvals WHERE run_id = :id ORDER BY step_no", {"id": run_id}
        )
    ]
    outbox = tx.fetchall(
        "SELECT key, step_no, tool, attempts, status, last_error, next_attempt_at, updated_at "
        "FROM outbox WHERE run_id = :id ORDER BY step_no, key",
        {"id": run_id},
    )
    effects = tx.fetchall(
        "SELECT key, step_no, status FROM effects WHERE run_id = :id ORDER BY step_no",
        {"id": run_id},
    )
    events = tx.fetchall(
        "SELECT seq, type, actor, at, data FROM events WHERE run_id = :id AND seq IS NOT NULL "
        "ORDER BY seq DESC LIMIT :n",
        {"id": run_id, "n": events_limit},
    )
    decoded = [
        {**dict(e), "data": json.loads(e["data"]) if e["data"] is not None else None}
        for e in reversed(events)
    ]
    return {
        "steps": steps,
        "approvals": approvals,
        "outbox": [dict(r) for r in outbox],
        "effects": [dict(r) for r in effects],
        "events": decoded,
    }


def one_step(tx: Tx, run_id: str, step_no: int) -> Any:
    """One journal entry of a run (a Step), or None."""
    found = tx.fetchall(
        "SELECT * FROM steps WHERE run_id = :id AND step_no = :n", {"id": run_id, "n": step_no}
    )
    return rows.step_from(found[0]) if found else None


# what needs a person ---------------------------------------------------------------


def attention(
    tx: Tx, tenant_id: str, group_limit: int = 50, dead_limit: int = 50
) -> dict[str, Any]:
    """The tenant's runs that wait for a person, grouped by status and cause as the run
    records it (a failed run's error class; a handed-over run's reason in words), the
    largest ``group_limit`` groups; how many are stuck; and the outbox's dead letters
    (newest first, at most ``dead_limit``)."""
    groups = tx.fetchall(
        "SELECT status, COALESCE(handover_reason, '') AS cause, COUNT(*) AS n, "
        "MAX(updated_at) AS latest FROM runs WHERE tenant_id = :t "
        "AND status IN ('needs_human', 'failed') "
        "GROUP BY status, COALESCE(handover_reason, '') ORDER BY n DESC, status, cause "
        "LIMIT :g",
        {"t": tenant_id, "g": group_limit},
    )
    terminal = ", ".join(f"'{s}'" for s in sorted(RunStatus.TERMINAL))
    stuck = tx.fetchall(
        "SELECT COUNT(*) AS n FROM runs WHERE tenant_id = :t AND stuck_mark IS NOT NULL "
        f"AND status NOT IN ({terminal})",
        {"t": tenant_id},
    )[0]["n"]
    dead = tx.fetchall(
        "SELECT o.key, o.run_id, o.step_no, o.tool, o.attempts, o.last_error, o.updated_at "
        "FROM outbox o JOIN runs r ON r.id = o.run_id WHERE o.status = 'dead' "
        "AND r.tenant_id = :t ORDER BY o.updated_at DESC LIMIT :n",
        {"t": tenant_id, "n": dead_limit},
    )
    return {
        "groups": [
            {"status": g["status"], "cause": g["cause"], "runs": int(g["n"]),
             "latest": g["latest"]}
            for g in groups
        ],
        "stuck": int(stuck),
        "dead": [dict(d) for d in dead],
    }  # fmt: skip


# the side effects ledger -----------------------------------------------------------

_WRITE = "s.kind IN ('tool', 'compensation') AND s.idempotency_key IS NOT NULL"
_LEDGER_COLUMNS = (
    "s.run_id, s.step_no, s.kind, s.name, s.status, s.input, s.output, s.attempts, "
    "s.idempotency_key, s.started_at, s.duration_ms, s.error_class, s.error, s.lease_epoch, "
    "r.status AS run_status, r.name AS agent, r.created_at AS run_created"
)


def ledger(
    tx: Tx, tenant_id: str, cursor: tuple[float, str] | None, limit: int = 50
) -> dict[str, Any]:
    """The tenant's writes (tool and compensation steps with a key): first every one
    whose outcome is open (in flight or unknown) in a run not finished (or handed to a
    person), then a page of all writes by their runs, newest run first, after
    ``cursor`` (the last run's created_at and id). Both walk runs by the tenant's index
    and each run's journal by its key."""
    open_rows = tx.fetchall(
        f"SELECT {_LEDGER_COLUMNS} FROM runs r JOIN steps s ON s.run_id = r.id "
        "WHERE r.tenant_id = :t AND r.status IN ('queued', 'running', 'waiting', "
        f"'needs_human') AND {_WRITE} AND s.status IN ('started', 'unknown', 'retrying') "
        "ORDER BY r.created_at, s.step_no LIMIT 200",
        {"t": tenant_id},
    )
    params: dict[str, Any] = {"t": tenant_id, "n": limit}
    after = ""
    if cursor is not None:
        after = "AND (r.created_at < :c_at OR (r.created_at = :c_at AND r.id < :c_id)) "
        params["c_at"], params["c_id"] = cursor
    # The runs of the page first (by the index), then their writes.
    page_runs = tx.fetchall(
        f"SELECT r.id, r.created_at FROM runs r WHERE r.tenant_id = :t {after}"
        f"AND EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.id AND {_WRITE}) "
        "ORDER BY r.created_at DESC, r.id DESC LIMIT :n",
        params,
    )
    rows_: list[dict[str, Any]] = []
    if page_runs:
        ids = {f"r{i}": r["id"] for i, r in enumerate(page_runs)}
        marks = ", ".join(f":{k}" for k in ids)
        rows_ = tx.fetchall(
            f"SELECT {_LEDGER_COLUMNS} FROM runs r JOIN steps s ON s.run_id = r.id "
            f"WHERE r.id IN ({marks}) AND {_WRITE} "
            "ORDER BY r.created_at DESC, r.id DESC, s.step_no",
            ids,
        )
    last = page_runs[-1] if len(page_runs) == limit else None
    return {
        "open": [_ledger_row(r) for r in open_rows],
        "writes": [_ledger_row(r) for r in rows_],
        "next": (float(last["created_at"]), last["id"]) if last else None,
    }


def _ledger_row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": rows.step_from({**r, "tokens": 0, "cost_usd": 0.0, "input_hash": None}),
        "run_status": r["run_status"],
        "agent": r["agent"],
    }


CHECK_ASKED = "effect.check_asked"
CHECK_ANSWERED = "effect.checked"


def claim_status_check(
    tx: Tx, run_id: str, step_no: int, key: str, tool: str, actor: str, every: float
) -> dict[str, Any] | None:
    """Record that ``actor`` asks the provider about write ``step_no`` of ``run_id`` now,
    unless someone asked within ``every`` seconds: then nothing is written and the
    earlier ask is returned (its time and who). The run row is locked first, so two
    asks at once are taken in turn and the second sees the first."""
    tx.execute("UPDATE runs SET event_seq = event_seq WHERE id = :id", {"id": run_id})
    now = time.time()
    found = tx.fetchall(
        "SELECT at, actor, data FROM events WHERE run_id = :id AND type = :t "
        "AND at > :since ORDER BY seq DESC",
        {"id": run_id, "t": CHECK_ASKED, "since": now - every},
    )
    for row in found:
        data = json.loads(row["data"]) if row["data"] else {}
        if isinstance(data, dict) and data.get("step_no") == step_no:
            return {"at": float(row["at"]), "actor": row["actor"]}
    insert_event(tx, run_id, CHECK_ASKED, actor,
                 {"step_no": step_no, "key": key, "tool": tool})  # fmt: skip
    return None


def record_status_check(tx: Tx, run_id: str, actor: str, data: dict[str, Any]) -> None:
    """The provider's answer to a status check, beside the journal's word, in the
    run's audit trail."""
    insert_event(tx, run_id, CHECK_ANSWERED, actor, data)


def group_runs(tx: Tx, tenant_id: str, status: str, cause: str, limit: int) -> list[str]:
    """Ids of the tenant's runs in ``status`` whose recorded cause is ``cause`` (one
    group of the needs-a-human page), oldest first, at most ``limit``."""
    found = tx.fetchall(
        "SELECT id FROM runs WHERE tenant_id = :t AND status = :s "
        "AND COALESCE(handover_reason, '') = :c ORDER BY created_at, id LIMIT :n",
        {"t": tenant_id, "s": status, "c": cause, "n": limit},
    )
    return [r["id"] for r in found]
