"""A group of accepted runs in a few statements (the set-based path of ``submit_group``).

:func:`agentledger.store.queries.service_runs.submit_run` costs about ten statements a
run (lookups, INSERT, UPDATEs, events, key row), each a round trip on PostgreSQL. Here a
whole group costs a few: one SELECT for the group's request ids already committed (a
group retried after a lost COMMIT reply), one for the rows of its Idempotency-Keys, the
quota decisions in memory from the group's :class:`QuotaBook`, then one multi-row INSERT
each for the runs (their service columns and ``event_seq`` already set), their
``run.submitted`` and ``run.accepted`` events and the key rows.

The decisions are those ``submit_run`` makes, in group order, with the same answers:
a request id already committed answers its run; a live key answers a replay, or
:class:`IdempotencyMismatch` for a different body; a key used twice in the group
answers the second as a replay of the first (or the mismatch); the quota refuses what
``submit_run`` would refuse. The rows written are those ``create_run``, ``insert_event``
and ``submit_run`` write.

The caller runs this under ONE savepoint: when any statement fails (a key committed by
another process since the read, say) it rolls the savepoint back and takes the
per-request path, where a refused submit fails alone.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from dataclasses import dataclass
from typing import Any

from agentledger.canonical import clean_text
from agentledger.errors import StoreError
from agentledger.records import Run, dumps
from agentledger.store import rows
from agentledger.store.dialect import Dialect
from agentledger.store.queries import service_audit
from agentledger.store.queries.common import RUN_COLUMNS, in_list
from agentledger.store.queries.runs import run_params
from agentledger.store.queries.service_quota import QuotaBook
from agentledger.store.queries.service_submits import (
    IdempotencyMismatch,
    SubmitRequest,
    Submitted,
)


def fast_path_fits(requests: list[SubmitRequest]) -> bool:
    """True when the set-based path decides exactly as ``submit_run`` would.

    Two submits of one group with the same request id (never sent by the service: each
    POST has its own) take the per-request path: the second answers the run the first
    made, as read back from its row.
    """
    ids = [r.new.request_id for r in requests if r.new.request_id is not None]
    return len(ids) == len(set(ids))


@dataclass
class _New:
    """A run the group will insert: its request, its row's parameters."""

    request: SubmitRequest
    params: dict[str, Any]
    run: Run | None = None
    answered: Run | None = None  # the run as submit_run answers it (no principal)
    body: Any = None


@dataclass
class _Key:
    """The live row of an Idempotency-Key as the group sees it: read, or to be written."""

    fingerprint: str
    run_id: str | None = None  # a committed row's run
    response: str | None = None  # a committed row's response
    new: _New | None = None  # written by this group


def submit_fast(
    d: Dialect, conn: Any, requests: list[SubmitRequest], book: QuotaBook
) -> list[Submitted | BaseException]:
    """Submit ``requests`` in a few statements; the outcome of each, in order.

    Raises when a statement fails: the caller rolls back its savepoint and takes the
    per-request path with the quota state it had before (``book`` is spent).
    """
    now = book.now
    committed = _committed_requests(d, conn, requests)
    keys, expired = _key_rows(d, conn, requests, now)
    replayed = _replayed_runs(d, conn, keys)

    # The decisions, in group order, as submit_run makes them (see its body).
    out: list[Submitted | BaseException | _New | tuple[_New, bool]] = []
    inserts: list[_New] = []
    for r in requests:
        new = r.new
        try:
            rid = new.request_id
            if rid is not None and rid in committed:
                run = committed[rid]
                out.append(Submitted(run, False, r.respond(run)))
                continue
            ident = (new.tenant_id, r.idem.key) if r.idem is not None else None
            if r.idem is not None and ident in keys:
                known = keys[ident]
                if known.fingerprint != r.idem.fingerprint:
                    raise IdempotencyMismatch(
                        f"Idempotency-Key {r.idem.key!r} was used with a different request body"
                    )
                if known.new is not None:  # a replay of this group's own run
                    out.append((known.new, True))
                    continue
                run_found = replayed.get(str(known.run_id))
                if run_found is None:  # pragma: no cover - the key commits with its run
                    raise StoreError(f"Idempotency-Key {r.idem.key!r} names a missing run")
                out.append(Submitted(run_found, True, json.loads(str(known.response))))
                continue
            book.check(d, conn, new.tenant_id)  # prepared: no statement
            pending = _New(r, _run_params(r))
        except Exception as exc:
            out.append(exc)
            continue
        book.accepted(new.tenant_id)
        inserts.append(pending)
        out.append(pending)
        if ident is not None and r.idem is not None:
            keys[ident] = _Key(r.idem.fingerprint, new=pending)

    if inserts:
        _insert_runs(d, conn, inserts)
        _insert_events(d, conn, inserts)
        d.notify_runnable(conn)  # one hint for the group: a wake-up, not a count
        _insert_keys(d, conn, inserts, expired, now)

    results: list[Submitted | BaseException] = []
    for item in out:
        if isinstance(item, _New):
            assert item.answered is not None
            # As submit_run answers: the run as read before its service columns were set.
            results.append(Submitted(item.answered, False, item.body))
        elif isinstance(item, tuple):
            first = item[0]
            assert first.run is not None
            # As find_idempotent answers: the run's row, the response as stored.
            results.append(Submitted(first.run, True, json.loads(dumps(first.body))))
        else:
            results.append(item)
    return results


def _committed_requests(d: Dialect, conn: Any, requests: list[SubmitRequest]) -> dict[str, Run]:
    """The runs already committed under the group's request ids (ONE statement)."""
    ids = [r.new.request_id for r in requests if r.new.request_id is not None]
    if not ids:
        return {}
    marks, params = in_list("q", ids)
    found = d.fetchall(
        conn, f"SELECT {RUN_COLUMNS} FROM runs WHERE request_id IN ({marks})", params
    )
    return {row["request_id"]: rows.run_from(row) for row in found}


def _key_rows(
    d: Dialect, conn: Any, requests: list[SubmitRequest], now: float
) -> tuple[dict[tuple[str, str], _Key], set[tuple[str, str]]]:
    """The live rows of the group's keys, and the keys with an expired row (ONE statement)."""
    wanted: dict[str, list[str]] = {}
    for r in requests:
        if r.idem is not None:
            keys_of = wanted.setdefault(r.new.tenant_id, [])
            if r.idem.key not in keys_of:
                keys_of.append(r.idem.key)
    if not wanted:
        return {}, set()
    where, params = _keys_where(wanted)
    found = d.fetchall(
        conn,
        "SELECT tenant_id, key, fingerprint, run_id, response, expires_at "
        f"FROM idempotency_keys WHERE {where}",
        params,
    )
    live: dict[tuple[str, str], _Key] = {}
    expired: set[tuple[str, str]] = set()
    for row in found:
        ident = (row["tenant_id"], row["key"])
        if float(row["expires_at"]) > now:
            live[ident] = _Key(row["fingerprint"], row["run_id"], row["response"])
        else:
            expired.add(ident)
    return live, expired


def _keys_where(wanted: dict[str, list[str]]) -> tuple[str, dict[str, Any]]:
    """``(tenant_id = t AND key IN (...)) OR ...``: the primary key's index, per tenant."""
    clauses, params = [], {}
    for t, (tenant, keys) in enumerate(sorted(wanted.items())):
        params[f"t{t}"] = tenant
        marks = []
        for k, key in enumerate(keys):
            params[f"k{t}_{k}"] = key
            marks.append(f":k{t}_{k}")
        clauses.append(f"(tenant_id = :t{t} AND key IN ({', '.join(marks)}))")
    return " OR ".join(clauses), params


def _replayed_runs(d: Dialect, conn: Any, keys: dict[tuple[str, str], _Key]) -> dict[str, Run]:
    """The runs of the live keys read (a statement only when a key is replayed)."""
    ids = sorted({str(k.run_id) for k in keys.values() if k.run_id is not None})
    if not ids:
        return {}
    marks, params = in_list("r", ids)
    found = d.fetchall(conn, f"SELECT {RUN_COLUMNS} FROM runs WHERE id IN ({marks})", params)
    return {row["id"]: rows.run_from(row) for row in found}


def _run_params(r: SubmitRequest) -> dict[str, Any]:
    """The run row's values, checked as ``create_run`` checks them (raises alike)."""
    return {
        **run_params(r.new),
        "principal": dumps(r.principal),
        "webhook": r.webhook,
        "idempotency_key": r.idem.key if r.idem is not None else None,
    }


_RUN_FIELDS = (
    "id", "tenant_id", "user_id", "kind", "name", "version", "target", "input", "status",
    "request_id", "principal", "webhook", "idempotency_key",
)  # fmt: skip


@functools.lru_cache(maxsize=64)
def _runs_sql(now: str, n: int) -> str:
    # event_seq = 2: the run.submitted (1) and run.accepted (2) events written with it.
    columns = ", ".join(_RUN_FIELDS)
    values = ", ".join(
        "(" + ", ".join(f":{f}{i}" for f in _RUN_FIELDS)
        + f", {now}, {now}, {now} + COALESCE(:available_in{i}, 0), 2)"
        for i in range(n)
    )  # fmt: skip
    return (
        f"INSERT INTO runs ({columns}, created_at, updated_at, available_at, event_seq) "
        f"VALUES {values} RETURNING {RUN_COLUMNS}"
    )


def _insert_runs(d: Dialect, conn: Any, inserts: list[_New]) -> None:
    """The run rows, with their service columns (ONE statement); fills ``run`` and
    ``body`` of each."""
    params: dict[str, Any] = {}
    for i, item in enumerate(inserts):
        for name in (*_RUN_FIELDS, "available_in"):
            params[f"{name}{i}"] = item.params[name]
    found = {row["id"]: row for row in d.fetchall(conn, _runs_sql(d.now_sql, len(inserts)), params)}
    for item in inserts:
        item.run = rows.run_from(found[item.params["id"]])
        # The response is built from the run as submit_run reads it (no principal column).
        item.answered = dataclasses.replace(item.run, principal=None)
        item.body = item.request.respond(item.answered)


@functools.lru_cache(maxsize=64)
def _events_sql(n: int, chained: bool) -> str:
    chain = ", :tenant{i}, :chain_no{i}, :prev_hash{i}, :hash{i}, :sig{i}" if chained else ""
    values = ", ".join(
        f"(:run{i}, :at, :type{i}, :actor{i}, :data{i}, :seq{i}, NULL{chain.format(i=i)})"
        for i in range(n)
    )
    columns = "run_id, at, type, actor, data, seq, token"
    if chained:
        columns += ", tenant_id, chain_no, prev_hash, hash, sig"
    return f"INSERT INTO events ({columns}) VALUES {values}"


def _insert_events(d: Dialect, conn: Any, inserts: list[_New]) -> None:
    """Each run's ``run.submitted`` (seq 1, as create_run) and ``run.accepted`` (seq 2,
    as submit_run), in the order the per-request path appends them (ONE statement).

    Where the backend allows it (``service_audit.CHAINED_AT_INSERT``: SQLite) they are
    inserted already chained into their tenant's audit chain, so the sealer has nothing
    to do for an accept; elsewhere the sealer chains them after the commit."""
    at = time.time()
    records: list[dict[str, Any]] = []
    for item in inserts:
        r, new = item.request, item.request.new
        principal = r.principal
        accepted = {
            "key_id": principal.get("key_id"),
            "roles": principal.get("roles"),
            "request_id": r.request_id,
            "idempotency_key": r.idem.key if r.idem else None,
            "webhook": r.webhook,
        }
        for seq, type_, actor, data in (
            (1, "run.submitted", new.user_id or "api", {"input": new.input}),
            (2, "run.accepted", str(principal.get("user_id")), accepted),
        ):
            # Text as it will be stored (every text parameter is cleaned on the way in):
            # the hash covers the stored row, and the tenant's head row is found by it.
            records.append({
                "tenant_id": clean_text(new.tenant_id), "run_id": item.params["id"], "seq": seq,
                "type": type_, "actor": clean_text(actor), "at": at, "data": dumps(data),
            })  # fmt: skip
    chained = d.name in service_audit.CHAINED_AT_INSERT
    if chained:
        service_audit.chain_at_insert(d, conn, records)
    params: dict[str, Any] = {"at": at}
    for n, rec in enumerate(records):
        params[f"run{n}"] = rec["run_id"]
        params[f"type{n}"] = rec["type"]
        params[f"actor{n}"] = rec["actor"]
        params[f"data{n}"] = rec["data"]
        params[f"seq{n}"] = rec["seq"]
        if chained:
            params[f"tenant{n}"] = rec["tenant_id"]
            params[f"chain_no{n}"] = rec["chain_no"]
            params[f"prev_hash{n}"] = rec["prev_hash"]
            params[f"hash{n}"] = rec["hash"]
            params[f"sig{n}"] = rec["sig"]
    d.execute(conn, _events_sql(len(records), chained), params)


def _key_order(item: _New) -> tuple[str, str]:
    idem = item.request.idem
    return (item.request.new.tenant_id, idem.key if idem is not None else "")


@functools.lru_cache(maxsize=64)
def _keys_sql(n: int) -> str:
    values = ", ".join(
        f"(:t{i}, :k{i}, :f{i}, :run{i}, 202, :body{i}, :now, :exp{i})" for i in range(n)
    )
    return (
        "INSERT INTO idempotency_keys (tenant_id, key, fingerprint, run_id, status_code, "
        f"response, created_at, expires_at) VALUES {values}"
    )


def _insert_keys(
    d: Dialect, conn: Any, inserts: list[_New], expired: set[tuple[str, str]], now: float
) -> None:
    """The key rows (ONE statement; one more first when an expired row of a key is
    replaced). Only an expired row is deleted: a live row committed by another process
    since the read makes the INSERT fail, and the group takes the per-request path."""
    keyed = [item for item in inserts if item.request.idem is not None]
    if not keyed:
        return
    # In key order: two processes inserting overlapping keys wait on each other in the
    # same order, instead of each holding one the other waits for (a deadlock).
    keyed.sort(key=_key_order)
    replace: dict[str, list[str]] = {}
    params: dict[str, Any] = {"now": now}
    for i, item in enumerate(keyed):
        idem, tenant = item.request.idem, item.request.new.tenant_id
        assert idem is not None
        if (tenant, idem.key) in expired:
            replace.setdefault(tenant, []).append(idem.key)
        params[f"t{i}"] = tenant
        params[f"k{i}"] = idem.key
        params[f"f{i}"] = idem.fingerprint
        params[f"run{i}"] = item.params["id"]
        params[f"body{i}"] = dumps(item.body)
        params[f"exp{i}"] = now + idem.ttl_seconds
    if replace:
        where, where_params = _keys_where(replace)
        d.execute(
            conn,
            f"DELETE FROM idempotency_keys WHERE expires_at <= :now AND ({where})",
            {"now": now, **where_params},
        )
    d.execute(conn, _keys_sql(len(keyed)), params)
