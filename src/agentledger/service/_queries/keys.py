"""API keys and tenants: only an HMAC of a key's secret is stored."""

from __future__ import annotations

import json
import time
from typing import Any

from agentledger.store._tx import Tx


def insert_key(
    tx: Tx,
    key_id: str,
    tenant_id: str,
    user_id: str,
    roles: list[str],
    secret_hash: str,
    last4: str,
    expires_at: float,
    pepper_id: str | None = None,
) -> None:
    """Store a new key (its secret's HMAC, never the secret), with the fingerprint of
    the pepper it was made under (``pepper_id``)."""
    ensure_tenant(tx, tenant_id)
    tx.execute(
        "INSERT INTO api_keys (id, tenant_id, user_id, roles, secret_hash, last4, created_at, "
        "expires_at, pepper_id) VALUES (:id, :t, :u, :roles, :h, :last4, :now, :exp, :pid)",
        {
            "id": key_id,
            "t": tenant_id,
            "u": user_id,
            "roles": json.dumps(sorted(set(roles))),
            "h": secret_hash,
            "last4": last4,
            "now": time.time(),
            "exp": expires_at,
            "pid": pepper_id,
        },
    )


def live_keys_by_pepper(tx: Tx, now: float) -> dict[str | None, int]:
    """How many unrevoked, unexpired keys each pepper fingerprint has (None: keys made
    before fingerprints were kept)."""
    found = tx.fetchall(
        "SELECT pepper_id, COUNT(*) AS n FROM api_keys WHERE revoked_at IS NULL "
        "AND expires_at > :now GROUP BY pepper_id",
        {"now": now},
    )
    return {r["pepper_id"]: int(r["n"]) for r in found}


def ensure_tenant(tx: Tx, tenant_id: str) -> None:
    """Create the tenant's row (default quotas) if it has none."""
    tx.execute(
        "INSERT INTO tenants (id, created_at) VALUES (:id, :now) ON CONFLICT (id) DO NOTHING",
        {"id": tenant_id, "now": time.time()},
    )


def set_tenant(
    tx: Tx,
    tenant_id: str,
    runs_per_minute: int | None,
    max_in_flight: int | None,
    webhook_secret: str | None = None,
) -> None:
    """Set a tenant's quotas (None: the server's default) and webhook secret."""
    ensure_tenant(tx, tenant_id)
    tx.execute(
        "UPDATE tenants SET runs_per_minute = :rpm, max_in_flight = :mif, "
        "webhook_secret = COALESCE(:secret, webhook_secret) WHERE id = :id",
        {"id": tenant_id, "rpm": runs_per_minute, "mif": max_in_flight, "secret": webhook_secret},
    )


def get_key(tx: Tx, key_id: str) -> dict[str, Any] | None:
    """A key's row (roles decoded), revoked or expired ones included."""
    found = tx.fetchall("SELECT * FROM api_keys WHERE id = :id", {"id": key_id})
    if not found:
        return None
    row = dict(found[0])
    row["roles"] = json.loads(row["roles"])
    return row


def list_keys(tx: Tx, tenant_id: str | None) -> list[dict[str, Any]]:
    """Keys without their hashes: id, tenant, user, roles, last four, dates."""
    where = "WHERE tenant_id = :t" if tenant_id else ""
    found = tx.fetchall(
        "SELECT id, tenant_id, user_id, roles, last4, created_at, expires_at, revoked_at "
        f"FROM api_keys {where} ORDER BY created_at",
        {"t": tenant_id},
    )
    out = []
    for r in found:
        row = dict(r)
        row["roles"] = json.loads(row["roles"])
        out.append(row)
    return out


def revoke_key(tx: Tx, key_id: str) -> bool:
    """Revoke a key (idempotent); False when there is no such key."""
    tx.execute(
        "UPDATE api_keys SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL",
        {"id": key_id, "now": time.time()},
    )
    return bool(tx.fetchall("SELECT id FROM api_keys WHERE id = :id", {"id": key_id}))
