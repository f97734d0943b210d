"""A store restored from a backup (docs/architecture.md, "Backup and restore").

A backup is older than the providers' ledgers: a run in flight when it was taken may
have made writes after it that its restored journal does not know of (journaled
``started``, or not journaled at all). :func:`mark_restored` marks every run not yet
terminal (``runs.restored_at``), so the engine status-checks each write such a run is
about to make for the first time instead of sending it blind (engine/_unknown.py). In the
same transaction the leases the backup holds are expired (their owners wrote to the store
that was replaced) and the backup's worker rows are deleted (none of them serves this
store); each marked run gets a ``run.restored`` audit event.

Pending outbox rows are in the same position (a row may have been delivered after the
backup, also one of a run that was already finished): each gets a history entry saying
its outcome is unknown (``maybe_applied``, next ``check``: the retry state the outbox
dispatcher resumes from, outbox.py ``_last_state``), so its next delivery asks the
provider first, or resends with the same key, or, with neither, becomes a dead letter
for a person instead of a second call.
"""

from __future__ import annotations

import time

from agentledger.records import RunStatus, dumps, loads
from agentledger.store._queries.events import insert_event
from agentledger.store._tx import Tx

RESTORED_EVENT = "run.restored"
_OPEN = ", ".join(f"'{s}'" for s in sorted(RunStatus.ALL) if s not in RunStatus.TERMINAL)
_RESUMABLE = f"'{RunStatus.FAILED}', '{RunStatus.NEEDS_HUMAN}'"


def mark_restored(tx: Tx, source: str, actor: str) -> int:
    """Mark every non-terminal run restored (see the module docstring); how many."""
    now = tx.now
    found = tx.fetchall(f"SELECT id FROM runs WHERE status IN ({_OPEN}) ORDER BY id")
    tx.execute(
        f"UPDATE runs SET restored_at = {now}, "
        f"lease_expires_at = CASE WHEN lease_owner IS NULL THEN lease_expires_at ELSE {now} END "
        f"WHERE status IN ({_OPEN})",
    )
    # A failed or needs_human run may have been resumed by a person after the backup and
    # made writes then: marked too, so a resume after the restore checks them the same way.
    tx.execute(f"UPDATE runs SET restored_at = {now} WHERE status IN ({_RESUMABLE})")
    for row in found:
        insert_event(tx, str(row["id"]), RESTORED_EVENT, actor, {"from": source})
    _unknown_retrying_writes(tx)
    _mark_outbox(tx, source)
    tx.execute("DELETE FROM workers")
    return len(found)


def _unknown_retrying_writes(tx: Tx) -> None:
    """A write waiting out a backoff in the backup (``retrying``: nothing applied yet)
    may have been sent again after it: its outcome is unknown now (resolved by its status
    check, or by a person), never a plain resend. Only writes: a write's first journal
    entry records whether it has a status check (engine/_unknown.py)."""
    found = tx.fetchall(
        "SELECT s.run_id, s.step_no, s.input, s.output FROM steps s JOIN runs r "
        f"ON r.id = s.run_id WHERE r.status IN ({_OPEN}) AND s.status = 'retrying' "
        "AND s.kind IN ('tool', 'compensation')",
    )
    for row in found:
        step_input = loads(row["input"])
        if not (isinstance(step_input, dict) and "status_check" in step_input):
            continue
        output = loads(row["output"])
        retry = output.get("retry") if isinstance(output, dict) else None
        state = dict(retry) if isinstance(retry, dict) else {}
        state["maybe_applied"] = True
        tx.execute(
            "UPDATE steps SET status = 'unknown', output = :output "
            "WHERE run_id = :run_id AND step_no = :step_no AND status = 'retrying'",
            {"run_id": row["run_id"], "step_no": row["step_no"],
             "output": dumps({"retry": state})},
        )  # fmt: skip


def _mark_outbox(tx: Tx, source: str) -> None:
    pending = tx.fetchall(
        "SELECT key, attempts, history FROM outbox WHERE status = 'pending' ORDER BY key"
    )
    for row in pending:
        history = loads(row["history"]) or []
        last = next(
            (
                e
                for e in reversed(history)
                if isinstance(e, dict) and isinstance(e.get("retry"), dict)
            ),
            None,
        )
        retry = dict(last["retry"]) if last else {"attempts": int(row["attempts"] or 0)}
        retry["maybe_applied"] = True
        history.append({"at": time.time(), "restored": source, "retry": retry, "next": "check"})
        tx.execute(
            "UPDATE outbox SET history = :history WHERE key = :key AND status = 'pending'",
            {"key": row["key"], "history": dumps(history)},
        )


__all__ = ["RESTORED_EVENT", "mark_restored"]
