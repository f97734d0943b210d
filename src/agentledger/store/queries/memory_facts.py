"""Per-user memory: facts an agent remembered about a user, scoped by tenant.

Every read and write names the tenant and the user: no statement here can reach another
tenant's or another user's facts. Forgetting deletes the rows and appends an audit event
in the same transaction; the event names the keys forgotten, never the facts' text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agentledger.store.dialect import Dialect
from agentledger.store.queries.common import new_id
from agentledger.store.queries.events import insert_tenant_event

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
    d: Dialect,
    conn: Any,
    tenant_id: str,
    user_id: str,
    fact_key: str,
    fact: str,
    source_run: str | None,
    source_key: str | None,
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
    d.execute(
        conn,
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
    found = d.fetchall(
        conn,
        f"SELECT {FACT_COLUMNS} FROM memory_facts "
        "WHERE tenant_id = :tenant AND user_id = :user AND fact_key = :key",
        params,
    )
    return _fact(found[0])


def list_facts(
    d: Dialect,
    conn: Any,
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
    found = d.fetchall(
        conn,
        sql,
        {"tenant": tenant_id, "user": user_id, "before": created_before, "limit": limit},
    )
    return [_fact(r) for r in found]


def fact_by_source(
    d: Dialect, conn: Any, tenant_id: str, user_id: str, source_key: str
) -> Fact | None:
    """The fact a step wrote (its idempotency key), if it is there."""
    found = d.fetchall(
        conn,
        f"SELECT {FACT_COLUMNS} FROM memory_facts WHERE source_key = :skey "
        "AND tenant_id = :tenant AND user_id = :user",
        {"skey": source_key, "tenant": tenant_id, "user": user_id},
    )
    return _fact(found[0]) if found else None


def forget_facts(
    d: Dialect,
    conn: Any,
    tenant_id: str,
    user_id: str,
    fact_key: str | None,
    actor: str,
) -> int:
    """Delete a user's facts (one key, or all of them); audit it. Returns rows deleted.

    Idempotent: forgetting again deletes nothing more (and records that it found none).
    """
    params = {"tenant": tenant_id, "user": user_id, "key": fact_key}
    where = "tenant_id = :tenant AND user_id = :user"
    if fact_key is not None:
        where += " AND fact_key = :key"
    keys = [
        r["fact_key"]
        for r in d.fetchall(conn, f"SELECT fact_key FROM memory_facts WHERE {where}", params)
    ]
    deleted = d.execute(conn, f"DELETE FROM memory_facts WHERE {where}", params)
    insert_tenant_event(
        d,
        conn,
        tenant_id,
        memory_audit_id(tenant_id, user_id),
        "memory.forgotten",
        actor,
        {
            "tenant_id": tenant_id,
            "user_id": user_id,
            "key": fact_key,
            "deleted": deleted,
            "keys": sorted(keys),
        },
    )
    return deleted


def all_facts(d: Dialect, conn: Any, tenant_id: str | None, user_id: str) -> list[Fact]:
    """A user's facts in one tenant, or in every tenant (``tenant_id`` None: operators)."""
    if tenant_id is not None:
        return list_facts(d, conn, tenant_id, user_id)
    found = d.fetchall(
        conn,
        f"SELECT {FACT_COLUMNS} FROM memory_facts WHERE user_id = :user "
        "ORDER BY tenant_id, updated_at DESC, id",
        {"user": user_id},
    )
    return [_fact(r) for r in found]
