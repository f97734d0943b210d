"""The outbox: side effects delivered later with their own retries."""

from __future__ import annotations

import time

from agentledger.records import (
    OutboxItem,
    dumps,
    loads,
)
from agentledger.store import _rows as rows
from agentledger.store._base import OutboxKeyTaken
from agentledger.store._queries.common import check_lease, check_time, delay_of, json_text
from agentledger.store._tx import Tx


def insert_outbox(tx: Tx, item: OutboxItem) -> None:
    """Insert a decided row. The same run writing its key again (a replayed step) is a
    no-op; a key another run holds raises :class:`OutboxKeyTaken` (the batch is refused:
    a later run's row must never be lost in silence)."""
    now = tx.now
    inserted = tx.execute(
        "INSERT INTO outbox (key, run_id, step_no, tool, payload, attempts, next_attempt_at, "
        "status, created_at, updated_at) VALUES (:key, :run_id, :step_no, :tool, :payload, 0, "
        f"{now} + COALESCE(:next_in, 0), 'pending', {now}, {now}) ON CONFLICT (key) DO NOTHING",
        {
            "key": item.key,
            "run_id": item.run_id,
            "step_no": item.step_no,
            "tool": item.tool,
            "payload": dumps(item.payload),
            # A time on the writer's clock, written as a delay on the database's.
            "next_in": delay_of(item.next_attempt_at or None),
        },
    )
    if inserted:
        return
    # PostgreSQL: a concurrent insert of the key was waited for, so its row is visible.
    found = tx.fetchall("SELECT run_id, step_no FROM outbox WHERE key = :key", {"key": item.key})
    if found and found[0]["run_id"] != item.run_id:
        raise OutboxKeyTaken(item.key, found[0]["run_id"], int(found[0]["step_no"]))


def claim_outbox(
    tx: Tx,
    owner: str,
    limit: int,
    lease_seconds: float,
    token: str | None = None,
) -> list[OutboxItem]:
    """Lease up to ``limit`` due rows. Only ``pending`` rows are claimed (a delivered or
    dropped row never is), each claim bumps the row's ``claim_epoch``, and the lease is
    judged by the database's clock. ``token`` marks the rows of this claim (see
    :func:`claimed_outbox`)."""
    check_lease(lease_seconds)
    now = tx.now
    found = tx.fetchall(
        f"SELECT key FROM outbox WHERE status = 'pending' AND next_attempt_at <= {now} "
        f"AND (lease_expires_at IS NULL OR lease_expires_at < {now}) "
        f"ORDER BY next_attempt_at LIMIT :limit{tx.dialect.skip_locked}",
        {"limit": limit},
    )
    claimed = []
    for r in found:
        got = tx.fetchall(
            f"UPDATE outbox SET lease_owner = :owner, lease_expires_at = {now} + :lease, "
            "claim_token = :token, "
            f"claim_epoch = claim_epoch + 1, updated_at = {now} WHERE key = :key "
            f"AND status = 'pending' AND (lease_expires_at IS NULL OR lease_expires_at < {now}) "
            "RETURNING *",
            {"owner": owner, "lease": float(lease_seconds), "key": r["key"], "token": token},
        )
        claimed += [rows.outbox_from(g) for g in got]
    return claimed


def claimed_outbox(tx: Tx, owner: str, token: str) -> list[OutboxItem] | None:
    """The rows a claim with ``token`` leased and still holds (a claim retried after a
    lost COMMIT reply), or None when that claim leased nothing."""
    found = tx.fetchall(
        "SELECT * FROM outbox WHERE claim_token = :token AND lease_owner = :owner "
        "AND status = 'pending' ORDER BY next_attempt_at",
        {"token": token, "owner": owner},
    )
    return [rows.outbox_from(r) for r in found] or None


def settle_outbox(tx: Tx, item: OutboxItem) -> bool:
    """Write a delivery attempt back, fenced by the claim ``item`` came from.

    The lease is cleared but the claimer's owner and epoch stay on the row, so the same
    settle retried (after a lost reply) writes the same values again, while a claimer
    whose row was claimed again since (new epoch) is refused: False, nothing written.
    A row dropped meanwhile (its run began compensating after the claim's lease ran
    out) stays dropped unless this delivery reached the provider (``delivered``): a
    "retry later" must never bring it back to ``pending``.
    """
    check_time("next_attempt_at", item.next_attempt_at)
    changed = tx.execute(
        f"UPDATE outbox SET attempts = :attempts, status = :status, "
        f"next_attempt_at = {tx.now} + :next_in, "
        "last_error = :err, history = :history, lease_expires_at = NULL, "
        f"updated_at = {tx.now} WHERE key = :key AND lease_owner = :owner "
        "AND claim_epoch = :epoch AND (status = 'pending' OR CAST(:status AS TEXT) = 'delivered')",
        {
            "attempts": item.attempts,
            "status": item.status,
            "next_in": delay_of(item.next_attempt_at),
            "err": item.last_error,
            "history": json_text("outbox history", item.history),
            "key": item.key,
            "owner": item.lease_owner,
            "epoch": item.claim_epoch,
        },
    )
    return changed > 0


def drop_outbox(tx: Tx, run_id: str, why: str) -> int:
    """Mark the run's pending rows that no live claim holds ``dropped`` (compensation
    began: what the run decided to send is no longer true). Returns how many."""
    now = tx.now
    found = tx.fetchall(
        "SELECT key, history FROM outbox WHERE run_id = :run_id AND status = 'pending' "
        f"AND (lease_expires_at IS NULL OR lease_expires_at < {now}) ORDER BY key",
        {"run_id": run_id},
    )
    dropped = 0
    for r in found:
        history = loads(r["history"]) or []
        history.append({"at": time.time(), "dropped": why})
        dropped += tx.execute(
            f"UPDATE outbox SET status = 'dropped', history = :history, updated_at = {now} "
            "WHERE key = :key AND status = 'pending' "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < {now})",
            {"key": r["key"], "history": dumps(history)},
        )
    return dropped


def list_outbox(tx: Tx, status: str | None = None, run_id: str | None = None) -> list[OutboxItem]:
    where = [w for w, v in (("status = :s", status), ("run_id = :r", run_id)) if v]
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    found = tx.fetchall(
        f"SELECT * FROM outbox {clause}ORDER BY created_at", {"s": status, "r": run_id}
    )
    return [rows.outbox_from(r) for r in found]
