"""Per-user memory: facts an agent remembered about a user, scoped by tenant.

Every read and write names the tenant and the user: no statement here can reach another
tenant's or another user's facts. Forgetting deletes the rows, erases the copies of their
text in the user's runs (see :func:`forget_facts`) and appends an audit event, in one
transaction; the event says how many facts were forgotten and their digest, never a key
or a fact.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from agentledger._auditkey import AuditKey
from agentledger.records import dumps
from agentledger.service._queries import audit as service_audit
from agentledger.store._queries.common import new_id
from agentledger.store._queries.events import insert_tenant_event
from agentledger.store._tx import Tx

FACT_COLUMNS = (
    "id, tenant_id, user_id, fact_key, fact, source_run, source_key, created_at, updated_at"
)


@dataclass
class Fact:
    """One remembered fact."""

    id: str
    tenant_id: str
    user_id: str
    fact_key: str
    fact: str
    source_run: str | None
    source_key: str | None
    created_at: float
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        """The fact as a tool returns it (JSON)."""
        return {
            "key": self.fact_key,
            "fact": self.fact,
            "source_run": self.source_run,
            "updated_at": self.updated_at,
        }


def memory_audit_id(tenant_id: str, user_id: str) -> str:
    """The events' ``run_id`` under which a user's memory changes are audited."""
    return f"memory/{tenant_id}/{user_id}"


def _fact(row: dict[str, Any]) -> Fact:
    return Fact(**{k: row[k] for k in FACT_COLUMNS.split(", ")})


def upsert_fact(
    tx: Tx,
    tenant_id: str,
    user_id: str,
    fact_key: str,
    fact: str,
    source_run: str | None = None,
    source_key: str | None = None,
) -> Fact:
    """Remember ``fact`` under ``fact_key``: insert, or update the text in place.

    Idempotent: the same call again leaves the same row (a retried step stores once).
    """
    now = time.time()
    params = {
        "id": new_id("f"),
        "tenant": tenant_id,
        "user": user_id,
        "key": fact_key,
        "fact": fact,
        "run": source_run,
        "skey": source_key,
        "now": now,
    }
    tx.execute(
        f"INSERT INTO memory_facts ({FACT_COLUMNS}) VALUES (:id, :tenant, :user, :key, :fact, "
        ":run, :skey, :now, :now) ON CONFLICT (tenant_id, user_id, fact_key) DO UPDATE SET "
        "fact = excluded.fact, source_run = excluded.source_run, "
        "source_key = excluded.source_key, updated_at = excluded.updated_at "
        # The same step again (a retry) changes nothing, not even updated_at, so the
        # retry returns exactly what the first attempt returned.
        "WHERE memory_facts.fact IS DISTINCT FROM excluded.fact "
        "OR memory_facts.source_key IS DISTINCT FROM excluded.source_key",
        params,
    )
    found = tx.fetchall(
        f"SELECT {FACT_COLUMNS} FROM memory_facts "
        "WHERE tenant_id = :tenant AND user_id = :user AND fact_key = :key",
        params,
    )
    return _fact(found[0])


def list_facts(
    tx: Tx,
    tenant_id: str,
    user_id: str,
    limit: int = 1000,
    created_before: float | None = None,
) -> list[Fact]:
    """A user's facts in one tenant, newest first (``created_before``: as of that time)."""
    sql = f"SELECT {FACT_COLUMNS} FROM memory_facts WHERE tenant_id = :tenant AND user_id = :user"
    if created_before is not None:
        sql += " AND created_at <= :before"
    sql += " ORDER BY updated_at DESC, id LIMIT :limit"
    found = tx.fetchall(
        sql,
        {"tenant": tenant_id, "user": user_id, "before": created_before, "limit": limit},
    )
    return [_fact(r) for r in found]


def fact_by_source(tx: Tx, tenant_id: str, user_id: str, source_key: str) -> Fact | None:
    """The fact a step wrote (its idempotency key), if it is there."""
    found = tx.fetchall(
        f"SELECT {FACT_COLUMNS} FROM memory_facts WHERE source_key = :skey "
        "AND tenant_id = :tenant AND user_id = :user",
        {"skey": source_key, "tenant": tenant_id, "user": user_id},
    )
    return _fact(found[0]) if found else None


#: What a forgotten text is replaced with wherever a copy of it is found.
REDACTED = "[forgotten]"
#: Texts shorter than this are erased only where they are a whole JSON string: as a
#: substring, "yes" or "vegan" would erase words of unrelated text.
SUBSTRING_MIN = 8

# Where copies of a user's remembered text are found: (table, key columns, columns), in
# the user's runs of the tenant (and the user's memory audit events).
_COPIES = (
    ("runs", ("id",), ("input", "result")),
    ("steps", ("run_id", "step_no"), ("input", "output")),
    ("events", ("id",), ("data",)),
    ("effects", ("key",), ("result",)),
    ("outbox", ("key",), ("payload", "last_error", "history")),
    ("approvals", ("id",), ("arguments",)),
)


class Forgotten(NamedTuple):
    """What :func:`forget_facts` did: facts deleted, and outbox rows of the user's runs
    that still hold a forgotten text because they are not delivered yet."""

    deleted: int
    undelivered: int


def forget_facts(
    tx: Tx,
    tenant_id: str,
    user_id: str,
    fact_key: str | None,
    actor: str,
    audit_key: AuditKey | None = None,
) -> Forgotten:
    """Delete a user's facts (one key, or all of them), erase every copy of their text
    (keys and facts) found in the user's runs of the tenant -- run input and result,
    journal input and output, event data, a settled key-less write's result, a delivered
    outbox row's payload, error and history, an approval's arguments -- and audit it.

    An outbox row not delivered yet keeps its payload: a resend under its key must carry
    what an earlier attempt may have delivered (a provider refuses, or applies twice, a
    key reused with other content). It is counted (``undelivered``), so the operator
    forgets again once it is delivered or dropped.

    A copy is replaced by :data:`REDACTED` in place (the JSON stays valid, so a replay
    reads the marker where the text was). A redacted event keeps the digest of its data
    as sealed (``data_digest``), so the audit chain still verifies; with ``audit_key``
    the redaction is signed (``redaction_sig``), so a verifier with the key tells it from
    an edit. The audit event
    holds the count and a digest of what was forgotten (ids, keys and facts: the ids are
    random, so the digest cannot be matched against guessed facts). Idempotent:
    forgetting again deletes nothing more (and records that it found none).
    """
    params = {"tenant": tenant_id, "user": user_id, "key": fact_key}
    where = "tenant_id = :tenant AND user_id = :user"
    if fact_key is not None:
        where += " AND fact_key = :key"
    found = tx.fetchall(
        f"SELECT id, fact_key, fact FROM memory_facts WHERE {where} ORDER BY id", params
    )
    deleted = tx.execute(f"DELETE FROM memory_facts WHERE {where}", params)
    texts = {t for r in found for t in (r["fact_key"], r["fact"]) if t}
    redacted, undelivered = _redact(tx, tenant_id, user_id, texts, audit_key)
    forgotten = [[r["id"], r["fact_key"], r["fact"]] for r in found]
    insert_tenant_event(
        tx,
        tenant_id,
        memory_audit_id(tenant_id, user_id),
        "memory.forgotten",
        actor,
        {
            "tenant_id": tenant_id,
            "user_id": user_id,
            "scope": "one key" if fact_key is not None else "every fact",
            "deleted": deleted,
            "digest": hashlib.sha256(dumps(forgotten).encode()).hexdigest() if found else None,
            "redacted": redacted,
            "undelivered": undelivered,
        },
    )
    return Forgotten(deleted, undelivered)


#: Needles per candidate query (each is a parameter and an ``instr`` per row).
_NEEDLES_PER_QUERY = 100


def _needles(texts: set[str]) -> tuple[list[str], re.Pattern[str]]:
    """What to look for -- each text as JSON stores it: escaped once (a string value) and
    twice (inside a string, such as a tool call's arguments) -- and one pattern that
    finds every copy, longest first, so a fact holding a key is erased whole. A short
    text is found only as a whole JSON string that is not an object's key (erasing a key
    such as ``"status"`` would change the journal's shape, not its content)."""
    finds: set[str] = set()
    patterns: list[tuple[int, str]] = []
    for text in texts:
        once = json.dumps(text)[1:-1]
        twice = json.dumps(once)[1:-1]
        if len(text) >= SUBSTRING_MIN:
            for form in (once, twice):
                finds.add(form)
                patterns.append((len(form), re.escape(form)))
        else:
            for quote, inner in (('"', once), ('\\"', twice)):
                form = quote + inner + quote
                finds.add(form)
                patterns.append((len(form), re.escape(form) + r"(?!\s*:)"))
    patterns.sort(key=lambda p: (-p[0], p[1]))
    return sorted(finds), re.compile("|".join(p for _, p in patterns))


def _marker(found: re.Match[str]) -> str:
    text = found.group(0)
    if text.startswith('\\"'):
        return '\\"' + REDACTED + '\\"'
    if text.startswith('"'):
        return '"' + REDACTED + '"'
    return REDACTED


def _redact(
    tx: Tx,
    tenant_id: str,
    user_id: str,
    texts: set[str],
    audit_key: AuditKey | None,
) -> tuple[dict[str, int], int]:
    """Replace every copy of ``texts`` in the user's runs of the tenant; return the
    values changed per table and the outbox rows left holding a copy (not delivered)."""
    changed = {table: 0 for table, _, _ in _COPIES}
    if not texts:
        return changed, 0
    finds, pattern = _needles(texts)
    base: dict[str, Any] = {"tenant": tenant_id, "user": user_id}
    base["audit"] = memory_audit_id(tenant_id, user_id)
    runs = "SELECT id FROM runs WHERE tenant_id = :tenant AND user_id = :user"
    scope = {
        "runs": f"id IN ({runs})",
        "steps": f"run_id IN ({runs})",
        "events": f"(run_id IN ({runs}) OR run_id = :audit)",
        # A claimed effect is a call that may be under way: its result is not in yet.
        "effects": f"run_id IN ({runs}) AND status <> 'claimed'",
        "outbox": f"run_id IN ({runs}) AND status = 'delivered'",
        # Pending ones too: the call they show is read from the journal, erased alike,
        # and the engine runs an approved call only if the two still agree.
        "approvals": f"run_id IN ({runs})",
    }
    undelivered: set[str] = set()
    find = "instr({col}, :n{i}) > 0" if tx.dialect.name == "sqlite" else "strpos({col}, :n{i}) > 0"
    for start in range(0, len(finds), _NEEDLES_PER_QUERY):
        batch = finds[start : start + _NEEDLES_PER_QUERY]
        params = base | {f"n{i}": needle for i, needle in enumerate(batch)}
        holds = " OR ".join(
            find.format(col=col, i=i)
            for col in ("payload", "last_error", "history")
            for i in range(len(batch))
        )
        undelivered.update(
            row["key"]
            for row in tx.fetchall(
                f"SELECT key FROM outbox WHERE run_id IN ({runs}) AND status <> 'delivered' "
                f"AND ({holds})",
                params,
            )
        )
        for table, keys, cols in _COPIES:
            for col in cols:
                holds = " OR ".join(find.format(col=col, i=i) for i in range(len(batch)))
                extra = ", data_digest" if table == "events" else ""
                rows = tx.fetchall(
                    f"SELECT {', '.join(keys)}, {col} AS old{extra} FROM {table} "
                    f"WHERE {scope[table]} AND ({holds})",
                    params,
                )
                for row in rows:
                    new = pattern.sub(_marker, row["old"])
                    if new == row["old"]:
                        continue  # a short text only as an object's key: nothing to erase
                    match = " AND ".join(f"{k} = :{k}" for k in keys)
                    values = {k: row[k] for k in keys} | {"new": new, "old": row["old"]}
                    digest = ""
                    if table == "events":
                        # The digest of the data as sealed stands for it in the chain.
                        sealed = row["data_digest"] or service_audit.text_digest(row["old"])
                        values["digest"] = sealed
                        values["rsig"] = (
                            None
                            if audit_key is None
                            else audit_key.sign_redaction(
                                tenant_id, int(row["id"]), sealed, service_audit.text_digest(new)
                            )
                        )
                        digest = ", data_digest = :digest, redaction_sig = :rsig"
                    # Only if unchanged since read: a row rewritten meanwhile is kept.
                    changed[table] += tx.execute(
                        f"UPDATE {table} SET {col} = :new{digest} WHERE {match} AND {col} = :old",
                        values,
                    )
    return changed, len(undelivered)


def tenants_with_facts(tx: Tx, user_id: str) -> list[str]:
    """The tenants where ``user_id`` has remembered facts (operators: the hint of a
    forget that matched nothing)."""
    found = tx.fetchall(
        "SELECT DISTINCT tenant_id FROM memory_facts WHERE user_id = :user ORDER BY tenant_id",
        {"user": user_id},
    )
    return [r["tenant_id"] for r in found]


def all_facts(tx: Tx, tenant_id: str | None, user_id: str) -> list[Fact]:
    """A user's facts in one tenant, or in every tenant (``tenant_id`` None: operators)."""
    if tenant_id is not None:
        return list_facts(tx, tenant_id, user_id)
    found = tx.fetchall(
        f"SELECT {FACT_COLUMNS} FROM memory_facts WHERE user_id = :user "
        "ORDER BY tenant_id, updated_at DESC, id",
        {"user": user_id},
    )
    return [_fact(r) for r in found]
