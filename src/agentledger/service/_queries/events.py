"""The service's event reads: a run's events by per-run ``seq`` (gapless, in commit order);
a tenant's events by their audit chain position (gapless, in sealing order)."""

from __future__ import annotations

import json
from typing import Any

from agentledger.store._queries.common import in_list
from agentledger.store._tx import Tx


def run_events(tx: Tx, run_id: str, after: int, limit: int) -> list[dict[str, Any]]:
    """Events of ``run_id`` with ``seq > after``, in seq order, at most ``limit``."""
    found = tx.fetchall(
        "SELECT seq, type, actor, at, data FROM events WHERE run_id = :id AND seq > :after "
        "ORDER BY seq LIMIT :limit",
        {"id": run_id, "after": after, "limit": limit},
    )
    return [
        {
            "seq": int(r["seq"]),
            "type": r["type"],
            "actor": r["actor"],
            "at": r["at"],
            "data": json.loads(r["data"]) if r["data"] is not None else None,
        }
        for r in found
    ]


def event_heads(tx: Tx, run_ids: list[str]) -> dict[str, tuple[int, str]]:
    """Run id -> (last event seq, status) for the runs being streamed."""
    if not run_ids:
        return {}
    params = {f"r{i}": r for i, r in enumerate(run_ids)}
    marks = ", ".join(f":{k}" for k in params)
    found = tx.fetchall(f"SELECT id, event_seq, status FROM runs WHERE id IN ({marks})", params)
    return {r["id"]: (int(r["event_seq"]), r["status"]) for r in found}


def last_event_of_types(tx: Tx, run_id: str, types: tuple[str, ...]) -> dict[str, Any] | None:
    """The run's latest event whose type is one of ``types`` (the terminal event)."""
    params: dict[str, Any] = {"id": run_id}
    params.update({f"t{i}": t for i, t in enumerate(types)})
    marks = ", ".join(f":t{i}" for i in range(len(types)))
    found = tx.fetchall(
        f"SELECT seq, type, actor, at, data FROM events WHERE run_id = :id AND type IN ({marks}) "
        "AND seq IS NOT NULL ORDER BY seq DESC LIMIT 1",
        params,
    )
    if not found:
        return None
    r = found[0]
    data = json.loads(r["data"]) if r["data"] is not None else None
    return {
        "seq": int(r["seq"]),
        "type": r["type"],
        "actor": r["actor"],
        "at": r["at"],
        "data": data,
    }


def tenant_heads(tx: Tx, tenant_ids: list[str]) -> dict[str, int]:
    """Tenant id -> the last position of its audit chain (tenants with none left out)."""
    if not tenant_ids:
        return {}
    marks, params = in_list("t", tenant_ids)
    found = tx.fetchall(
        f"SELECT tenant_id, chain_no FROM audit_heads WHERE tenant_id IN ({marks})", params
    )
    return {r["tenant_id"]: int(r["chain_no"]) for r in found}


def tenant_events(tx: Tx, tenant_id: str, after: int, limit: int) -> list[dict[str, Any]]:
    """The tenant's sealed events after chain position ``after``, in chain order (by the
    ``events_chain`` index), at most ``limit``: position, run (or audit id), type."""
    found = tx.fetchall(
        "SELECT chain_no, run_id, type FROM events WHERE tenant_id = :t AND chain_no > :after "
        "ORDER BY chain_no LIMIT :limit",
        {"t": tenant_id, "after": after, "limit": limit},
    )
    return [{"chain_no": int(r["chain_no"]), "run_id": r["run_id"], "type": r["type"]}
            for r in found]  # fmt: skip
