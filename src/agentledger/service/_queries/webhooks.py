"""Webhook deliveries: enqueued once per reported event, claimed with a lease, settled.

A delivery row is written in the transaction that seals its event into the audit chain
(:func:`agentledger.service._queries.audit.seal`), which happens exactly once per
event, so each event is enqueued once; its id (``evt_<run>_<seq>``) is what receivers
deduplicate on, the same on every retry.

A body describes the run as it was when the event happened, not when it was sealed
(about a second later, by which time a handed-over run may have been resumed and
completed): the status is the event's (``run.stuck``: the status its data records), and
result, error and handover reason come from the ending event's own data (``run``, written
with the run's row by the engine). Events written before their data carried the run fall
back to the row, and only while the row still has the event's status.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from agentledger.records import DeliveryStatus, dumps
from agentledger.store._tx import Tx

# Event type in the journal -> webhook event type.
REPORTED = {
    "run.completed": "run.completed",
    "run.failed": "run.failed",
    "run.handover": "run.needs_human",
    "approval.requested": "approval.needed",
    "run.stuck": "run.stuck",  # observe/_stuck.py: once per stuck episode
}


def enqueue_for_events(tx: Tx, tenant_id: str, events: list[dict[str, Any]]) -> None:
    """Enqueue the webhook of each of ``events`` (one seal's records of the tenant, in
    chain order) whose type is reported and whose run has a URL. The runs are read in
    one statement, not one per event: on a server each read is a round trip."""
    reported = [e for e in events if e["type"] in REPORTED]
    if not reported:
        return
    among, params = tx.dialect.among("id", sorted({str(e["run_id"]) for e in reported}))
    found = tx.fetchall(
        "SELECT id, webhook, name, version, status, result, error, handover_reason, user_id "
        f"FROM runs WHERE webhook IS NOT NULL AND {among}",
        params,
    )
    runs = {r["id"]: r for r in found}
    for row in reported:
        run = runs.get(row["run_id"])
        if run is not None and run["webhook"]:
            _enqueue(tx, tenant_id, row, REPORTED[row["type"]], run)


def _enqueue(tx: Tx, tenant_id: str, row: dict[str, Any], kind: str, run: dict[str, Any]) -> None:
    """Enqueue the ``kind`` webhook of the event ``row`` of ``run`` (its row now)."""
    event_id = f"evt_{row['run_id']}_{row['seq']}"
    body = {
        "id": event_id,
        "type": kind,
        "tenant": tenant_id,
        "run_id": row["run_id"],
        "agent": run["name"],
        "version": run["version"],
        "user": run["user_id"],
        "occurred_at": row["at"],
        "data": json.loads(row["data"]) if row["data"] is not None else None,
    }
    if kind != "approval.needed":
        body["run"] = _run_at_event(row["type"], body["data"], run)
        if isinstance(body["data"], dict):
            body["data"].pop("run", None)  # it is the body's ``run``
    _insert(tx, event_id, tenant_id, row["run_id"], run["webhook"], kind, body)


# Event type -> the run's status it implies (run.stuck: in its data).
ENDED_AS = {"run.completed": "completed", "run.failed": "failed", "run.handover": "needs_human"}
_RUN_FIELDS = ("status", "result", "error", "handover_reason")


def _run_at_event(event_type: str, data: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The run's part of a body: the run as ``event_type`` (with ``data``) left it.

    ``row`` (the run's row now, at seal time) is read only for an ending event written
    before ending events recorded the run (no ``run`` in their data), and only while the
    row still holds the event's status: else the run has moved on, and what it was is
    not known (None) rather than misreported.
    """
    data = data if isinstance(data, dict) else {}
    ended = data.get("run")
    if isinstance(ended, dict):
        found = {k: ended.get(k) for k in _RUN_FIELDS}
        if event_type == "run.completed" and row["status"] == "completed":
            # The event does not copy the result: a completed run never changes again.
            found["result"] = json.loads(row["result"]) if row["result"] is not None else None
        return found
    if event_type == "run.stuck":
        # A stuck run is queued, running or waiting: its row holds no result, error or
        # handover reason then (they are written only by a terminal status, and cleared
        # by a resume), whatever it holds by the time the event is sealed.
        status = data.get("status")
        return {"status": status, "result": None, "error": None, "handover_reason": None}
    status = ENDED_AS.get(event_type)
    if status is None or row["status"] != status:
        return {"status": status, "result": None, "error": None, "handover_reason": None}
    return {
        "status": status,
        "result": json.loads(row["result"]) if row["result"] is not None else None,
        "error": row["error"],
        "handover_reason": row["handover_reason"],
    }


def _insert(
    tx: Tx, event_id: str, tenant_id: str, run_id: str, url: str, kind: str,
    body: dict[str, Any],
) -> None:  # fmt: skip
    now = time.time()
    tx.execute(
        "INSERT INTO webhook_deliveries (id, tenant_id, run_id, url, type, body, "
        "next_attempt_at, created_at) VALUES (:id, :t, :run, :url, :type, :body, :now, :now) "
        "ON CONFLICT (id) DO NOTHING",
        {
            "id": event_id,
            "t": tenant_id,
            "run": run_id,
            "url": url,
            "type": kind,
            "body": dumps(body),
            "now": now,
        },
    )


def enqueue_expiring(tx: Tx, now: float, fraction: float = 0.8) -> int:
    """Enqueue ``approval.expiring`` for pending approvals past ``fraction`` of their time
    to live (once each: the delivery id is derived from the approval)."""
    found = tx.fetchall(
        "SELECT a.id, a.run_id, a.tool, a.required_role, a.expires_at, a.requested_at, "
        "r.tenant_id, r.webhook, r.name FROM approvals a JOIN runs r ON r.id = a.run_id "
        "WHERE a.decision IS NULL AND r.webhook IS NOT NULL AND a.expires_at > :now "
        "AND a.requested_at + (a.expires_at - a.requested_at) * :f <= :now",
        {"now": now, "f": fraction},
    )
    for a in found:
        event_id = f"evt_{a['id']}_expiring"
        body = {
            "id": event_id,
            "type": "approval.expiring",
            "tenant": a["tenant_id"],
            "run_id": a["run_id"],
            "agent": a["name"],
            "occurred_at": now,
            "data": {
                "approval_id": a["id"],
                "tool": a["tool"],
                "role": a["required_role"],
                "expires_at": a["expires_at"],
            },
        }
        _insert(tx, event_id, a["tenant_id"], a["run_id"], a["webhook"], body["type"], body)
    return len(found)


def claim_due(
    tx: Tx, now: float, limit: int, lease: float, owner: str = ""
) -> list[dict[str, Any]]:
    """Due pending deliveries, each leased to ``owner`` (one claimer at a time).

    A claim takes the row only while no other lease on it is live, and takes the next
    ``lease_epoch``: the attempt is written back under that epoch (:func:`settle`), so
    a claimer whose lease ran out cannot overwrite the outcome of the one after it.

    Leases are set and judged by the database's clock: a claimer whose clock runs ahead
    by more than a lease would take every live claim (and send what another is sending).
    """
    # In one total order (ties broken by id): two claimers lock rows in the same order
    # and never deadlock on PostgreSQL.
    db_now = tx.now
    found = tx.fetchall(
        "SELECT id FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= :now "
        f"AND (lease_until IS NULL OR lease_until <= {db_now}) ORDER BY next_attempt_at, id "
        "LIMIT :limit",
        {"now": now, "limit": limit},
    )
    claimed = []
    for r in found:
        got = tx.execute(
            f"UPDATE webhook_deliveries SET lease_until = {db_now} + :lease, "
            "lease_owner = :owner, lease_epoch = lease_epoch + 1 WHERE id = :id "
            f"AND status = 'pending' AND (lease_until IS NULL OR lease_until <= {db_now})",
            {"id": r["id"], "lease": float(lease), "owner": owner},
        )
        if got:
            row = tx.fetchall("SELECT * FROM webhook_deliveries WHERE id = :id", {"id": r["id"]})
            claimed.append(dict(row[0]))
    return claimed


def settle_delivery(
    tx: Tx, delivery_id: str, delivered: bool, error: str | None,
    next_attempt_at: float, dead: bool, epoch: int | None = None,
) -> bool:  # fmt: skip
    """Record one attempt's outcome; with ``epoch``, only under that claim (else False:
    the lease ran out and another claimer owns the delivery now)."""
    status = (
        DeliveryStatus.DELIVERED
        if delivered
        else (DeliveryStatus.DEAD if dead else DeliveryStatus.PENDING)
    )
    fence = "" if epoch is None else " AND lease_epoch = :epoch AND status = 'pending'"
    return bool(tx.execute(
        "UPDATE webhook_deliveries SET status = :s, attempts = attempts + 1, last_error = :e, "
        "next_attempt_at = :n, lease_until = NULL, lease_owner = NULL, "
        "delivered_at = CASE WHEN :s = 'delivered' THEN :now ELSE NULL END WHERE id = :id"
        + fence,
        {"s": status, "e": error, "n": next_attempt_at, "id": delivery_id, "now": time.time(),
         "epoch": epoch},
    ))  # fmt: skip


def webhook_secret(tx: Tx, tenant_id: str) -> str:
    """The tenant's webhook signing secret (made on first use)."""
    tx.execute(
        "INSERT INTO tenants (id, created_at) VALUES (:id, :now) ON CONFLICT (id) DO NOTHING",
        {"id": tenant_id, "now": time.time()},
    )
    tx.execute(
        "UPDATE tenants SET webhook_secret = :s WHERE id = :id AND webhook_secret IS NULL",
        {"id": tenant_id, "s": "whsec_" + secrets.token_urlsafe(32)},
    )
    found = tx.fetchall("SELECT webhook_secret FROM tenants WHERE id = :id", {"id": tenant_id})
    return str(found[0]["webhook_secret"])


def deliveries(tx: Tx, run_id: str | None = None) -> list[dict[str, Any]]:
    """Delivery rows (for operators and tests)."""
    where = "WHERE run_id = :run" if run_id else ""
    return [dict(r) for r in tx.fetchall(
        f"SELECT * FROM webhook_deliveries {where} ORDER BY created_at", {"run": run_id}
    )]  # fmt: skip
