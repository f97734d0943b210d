"""Shared pieces of the SQL: run columns and time-ordered ids."""

from __future__ import annotations

import secrets
import time

RUN_COLUMNS = (
    "id, tenant_id, user_id, kind, name, version, input, status, step_count, tokens, "
    "cost_usd, active_seconds, created_at, updated_at, lease_owner, lease_epoch, "
    "lease_expires_at, available_at, resumes, result, error, handover_reason, cancel_requested, "
    "request_id"
)


def new_token() -> str:
    """A random token that marks one write (see ``runs.write_token``)."""
    return secrets.token_hex(8)


def new_id(prefix: str = "") -> str:
    """A time-ordered id: milliseconds then randomness, so ids sort by creation."""
    return f"{prefix}{int(time.time() * 1000):011x}{secrets.token_hex(5)}"
