"""A store restored from a backup (docs/architecture.md, "Backup and restore").

A backup is older than the providers' ledgers: a run in flight when it was taken may
have made writes after it that its restored journal does not know of (journaled
``started``, or not journaled at all). :func:`mark_restored` marks every run not yet
terminal (``runs.restored_at``), so the engine status-checks each write such a run is
about to make for the first time instead of sending it blind (engine/unknown.py). In the
same transaction the leases the backup holds are expired (their owners wrote to the store
that was replaced) and the backup's worker rows are deleted (none of them serves this
store); each marked run gets a ``run.restored`` audit event.
"""

from __future__ import annotations

from typing import Any

from agentledger.records import RunStatus
from agentledger.store.dialect import Dialect
from agentledger.store.queries.events import insert_event

RESTORED_EVENT = "run.restored"
_OPEN = ", ".join(f"'{s}'" for s in sorted(RunStatus.ALL) if s not in RunStatus.TERMINAL)


def mark_restored(d: Dialect, conn: Any, source: str, actor: str) -> int:
    """Mark every non-terminal run restored (see the module docstring); how many."""
    now = d.now_sql
    found = d.fetchall(conn, f"SELECT id FROM runs WHERE status IN ({_OPEN}) ORDER BY id")
    d.execute(
        conn,
        f"UPDATE runs SET restored_at = {now}, "
        f"lease_expires_at = CASE WHEN lease_owner IS NULL THEN lease_expires_at ELSE {now} END "
        f"WHERE status IN ({_OPEN})",
    )
    for row in found:
        insert_event(d, conn, str(row["id"]), RESTORED_EVENT, actor, {"from": source})
    d.execute(conn, "DELETE FROM workers")
    return len(found)


__all__ = ["RESTORED_EVENT", "mark_restored"]
