"""Accepting a run: what ``POST /v1/runs`` decides and writes, in one place.

An accept is ONE transaction: the quota check, the run row with its service columns,
its ``run.submitted`` and ``run.accepted`` events and the Idempotency-Key row, so a key
never exists without its run nor a run without its key. :func:`accept` takes a group of
submits (concurrent requests the :class:`~agentledger.service._accepts.AcceptBatcher`
commits together, or one alone) and answers each, in group order:

* a request id already committed answers the run it made (a group retried after its
  COMMIT reply was lost writes nothing twice);
* a live Idempotency-Key answers the run it names with the response recorded with it
  (a replay), or :class:`IdempotencyMismatch` for a different body; a key used twice in
  one group answers the second as a replay of the first;
* the tenant's quota (:class:`~agentledger.service._queries.quota.QuotaBook`)
  refuses with :class:`QuotaExceeded`;
* otherwise the run is written.

The group costs a few statements, not a few per run: one SELECT for the group's request
ids already committed, one for the rows of its keys, the decisions in memory, then one
multi-row INSERT each for the runs (service columns and ``event_seq`` set), their events
and the key rows. The events are inserted unsealed; the sealer (``agentledger/_sealer.py``)
chains them into their tenants' audit chains, as every other event.

The group runs under one savepoint. When a statement fails (a key another process
committed since the read, two submits with one request id) the savepoint is rolled back
and each submit is accepted again alone, by the same code under a savepoint of its own,
reading afresh: the other process's key is then replayed, and a submit that still fails
fails alone. A lost connection or a deadlock is not caught: the store retries the whole
group.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentledger._canonical import clean_text
from agentledger.errors import StoreError
from agentledger.records import Run, dumps
from agentledger.service._queries.quota import Quota, QuotaBook, QuotaExceeded
from agentledger.store import _rows as rows
from agentledger.store._base import NewRun
from agentledger.store._queries.common import RUN_COLUMNS, in_list
from agentledger.store._queries.runs import run_params
from agentledger.store._tx import Tx

__all__ = [
    "IdempotencyMismatch",
    "IdempotencyRequest",
    "Quota",
    "QuotaExceeded",
    "SubmitRequest",
    "Submitted",
    "accept",
]


class IdempotencyMismatch(StoreError):
    """The Idempotency-Key was used before with a different request body."""


@dataclass
class IdempotencyRequest:
    """The key, the request's fingerprint, how long the key is kept."""

    key: str
    fingerprint: str
    ttl_seconds: float


@dataclass
class Submitted:
    """The run a submit created or found, and the response body recorded with it."""

    run: Run
    replayed: bool
    response: Any = None


@dataclass
class SubmitRequest:
    """One submit: the run, who asks, its webhook, key and quota. ``respond(run)``
    builds the response body recorded with the key, so a replay answers exactly what the
    first request answered; ``request_id`` is the HTTP request's (for the audit record)."""

    new: NewRun
    principal: dict[str, Any]
    webhook: str | None
    idem: IdempotencyRequest | None
    quota: Quota
    respond: Callable[[Run], Any]
    request_id: str | None = None


Outcome = Submitted | BaseException


def accept(tx: Tx, requests: list[SubmitRequest]) -> list[Outcome]:
    """Accept ``requests`` in this transaction; the outcome of each, in order: its
    :class:`Submitted`, or the error refusing it (rolled back alone).

    The quota locks of the group's tenants are taken first, in tenant order, outside any
    savepoint (a savepoint rolled back would release a lock taken inside it). One
    default quota per ``serve`` process: every request of a group carries the same.
    """
    if not requests:
        return []
    book = QuotaBook(requests[0].quota, time.time())
    book.prepare(tx, [r.new.tenant_id for r in requests])
    spare = copy.deepcopy(book)
    try:
        return _savepoint(tx, "accept_group", lambda: _accept_set(tx, requests, book))
    except _RolledBack:
        book = spare
    out: list[Outcome] = []
    for i, r in enumerate(requests):
        before = copy.deepcopy(book)
        alone = functools.partial(_accept_set, tx, [r], book)
        try:
            out += _savepoint(tx, f"accept{i}", alone)
        except _RolledBack as rolled:
            book = before  # nothing of it was written: its run is not counted
            out.append(rolled.error)
    return out


class _RolledBack(Exception):
    """A savepoint was rolled back after ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _savepoint(tx: Tx, name: str, work: Callable[[], list[Outcome]]) -> list[Outcome]:
    """``work()`` under savepoint ``name``; :class:`_RolledBack` when it raised (a lost
    connection or a transient error is raised as it is: the store retries the group)."""
    tx.execute(f"SAVEPOINT {name}")
    try:
        done = work()
    except Exception as exc:
        if tx.dialect.is_disconnect(exc) or tx.dialect.is_transient(exc):
            raise
        tx.execute(f"ROLLBACK TO SAVEPOINT {name}")
        tx.execute(f"RELEASE SAVEPOINT {name}")
        raise _RolledBack(exc) from exc
    tx.execute(f"RELEASE SAVEPOINT {name}")
    return done


@dataclass
class _New:
    """A run the group will insert: its request, its row's parameters."""

    request: SubmitRequest
    params: dict[str, Any]
    run: Run | None = None
    answered: Run | None = None  # the run as the response shows it (no principal)
    body: Any = None


@dataclass
class _Key:
    """The live row of an Idempotency-Key as the group sees it: read, or to be written."""

    fingerprint: str
    run_id: str | None = None  # a committed row's run
    response: str | None = None  # a committed row's response
    new: _New | None = None  # written by this group


def _accept_set(tx: Tx, requests: list[SubmitRequest], book: QuotaBook) -> list[Outcome]:
    """Decide and write ``requests`` in a few statements; raises when a statement fails
    (``book`` is then spent: the caller restores its copy)."""
    now = book.now
    committed = _committed_requests(tx, requests)
    keys, expired = _key_rows(tx, requests, now)
    replayed = _replayed_runs(tx, keys)

    out: list[Outcome | _New | tuple[_New, bool]] = []
    inserts: list[_New] = []
    for r in requests:
        new = r.new
        try:
            rid = clean_text(new.request_id) if new.request_id is not None else None
            if rid is not None and rid in committed:
                run = committed[rid]
                out.append(Submitted(run, False, r.respond(run)))
                continue
            ident = _ident(new.tenant_id, r.idem.key) if r.idem is not None else None
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
            book.check(tx, new.tenant_id)  # prepared: no statement
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
        _insert_runs(tx, inserts)
        _insert_events(tx, inserts)
        tx.dialect.notify_runnable(tx.conn)  # one hint for the group: a wake-up, not a count
        _insert_keys(tx, inserts, expired, now)

    results: list[Outcome] = []
    for item in out:
        if isinstance(item, _New):
            assert item.answered is not None
            results.append(Submitted(item.answered, False, item.body))
        elif isinstance(item, tuple):
            first = item[0]
            assert first.run is not None
            # As a replay from an earlier group answers: the run's row, the response
            # as stored.
            results.append(Submitted(first.run, True, json.loads(dumps(first.body))))
        else:
            results.append(item)
    return results


def _ident(tenant_id: str, key: str) -> tuple[str, str]:
    """A key's (tenant, key) as stored and read back: the store writes text cleaned (a
    NUL or a lone surrogate as U+FFFD), so the rows read (keys, request ids) are
    matched cleaned."""
    return clean_text(tenant_id), clean_text(key)


def _committed_requests(tx: Tx, requests: list[SubmitRequest]) -> dict[str, Run]:
    """The runs already committed under the group's request ids (ONE statement)."""
    ids = [r.new.request_id for r in requests if r.new.request_id is not None]
    if not ids:
        return {}
    marks, params = in_list("q", ids)
    found = tx.fetchall(f"SELECT {RUN_COLUMNS} FROM runs WHERE request_id IN ({marks})", params)
    return {row["request_id"]: rows.run_from(row) for row in found}


def _key_rows(
    tx: Tx, requests: list[SubmitRequest], now: float
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
    found = tx.fetchall(
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


def _replayed_runs(tx: Tx, keys: dict[tuple[str, str], _Key]) -> dict[str, Run]:
    """The runs of the live keys read (a statement only when a key is replayed)."""
    ids = sorted({str(k.run_id) for k in keys.values() if k.run_id is not None})
    if not ids:
        return {}
    marks, params = in_list("r", ids)
    found = tx.fetchall(f"SELECT {RUN_COLUMNS} FROM runs WHERE id IN ({marks})", params)
    return {row["id"]: rows.run_from(row) for row in found}


def _run_params(r: SubmitRequest) -> dict[str, Any]:
    """The run row's values with its service columns, checked as the store checks a new
    run's (a bad time or input raises, refusing that submit alone)."""
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


def _insert_runs(tx: Tx, inserts: list[_New]) -> None:
    """The run rows, with their service columns (ONE statement); fills ``run`` and
    ``body`` of each."""
    params: dict[str, Any] = {}
    for i, item in enumerate(inserts):
        for name in (*_RUN_FIELDS, "available_in"):
            params[f"{name}{i}"] = item.params[name]
    found = {row["id"]: row for row in tx.fetchall(_runs_sql(tx.now, len(inserts)), params)}
    for item in inserts:
        item.run = rows.run_from(found[item.params["id"]])
        # A new run is answered as the store's create_run answers it: without the
        # service's columns (the response states the caller from the request).
        item.answered = dataclasses.replace(item.run, principal=None)
        item.body = item.request.respond(item.answered)


@functools.lru_cache(maxsize=64)
def _events_sql(n: int) -> str:
    values = ", ".join(
        f"(:run{i}, :at, :type{i}, :actor{i}, :data{i}, :seq{i}, NULL)" for i in range(n)
    )
    return f"INSERT INTO events (run_id, at, type, actor, data, seq, token) VALUES {values}"


def _insert_events(tx: Tx, inserts: list[_New]) -> None:
    """Each run's ``run.submitted`` (seq 1, as the store's ``create_run`` writes it) and
    ``run.accepted`` (seq 2: who started the run, in the audit trail with it), in
    group order (ONE statement)."""
    params: dict[str, Any] = {"at": time.time()}
    n = 0
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
            params[f"run{n}"] = item.params["id"]
            params[f"type{n}"] = type_
            params[f"actor{n}"] = actor
            params[f"data{n}"] = dumps(data)
            params[f"seq{n}"] = seq
            n += 1
    tx.execute(_events_sql(n), params)


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


def _insert_keys(tx: Tx, inserts: list[_New], expired: set[tuple[str, str]], now: float) -> None:
    """The key rows (ONE statement; one more first when an expired row of a key is
    replaced). Only an expired row is deleted: a live row committed by another process
    since the read makes the INSERT fail, and each submit is accepted again alone."""
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
        if _ident(tenant, idem.key) in expired:
            replace.setdefault(tenant, []).append(idem.key)
        params[f"t{i}"] = tenant
        params[f"k{i}"] = idem.key
        params[f"f{i}"] = idem.fingerprint
        params[f"run{i}"] = item.params["id"]
        params[f"body{i}"] = dumps(item.body)
        params[f"exp{i}"] = now + idem.ttl_seconds
    if replace:
        where, where_params = _keys_where(replace)
        tx.execute(
            f"DELETE FROM idempotency_keys WHERE expires_at <= :now AND ({where})",
            {"now": now, **where_params},
        )
    tx.execute(_keys_sql(len(keyed)), params)


def purge_idempotency_keys(tx: Tx, now: float) -> int:
    """Delete expired Idempotency-Key rows (an expired key answers nothing: the next
    submit with it starts a new run)."""
    return tx.execute("DELETE FROM idempotency_keys WHERE expires_at <= :now", {"now": now})
