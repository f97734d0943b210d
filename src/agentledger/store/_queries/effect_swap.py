"""An effects-table write outside any run's fence: the outbox claims effect keys
for its deliveries after their run may have ended."""

from __future__ import annotations

import time
from typing import Any

from agentledger._canonical import clean_text
from agentledger.records import Effect, loads
from agentledger.store import _rows as rows
from agentledger.store._queries.common import json_text
from agentledger.store._tx import Tx


def swap_effect(tx: Tx, effect: Effect, expected: str | None) -> tuple[bool, Effect | None]:
    """Write ``effect`` only if its key's row has status ``expected`` (None: no row).

    Returns (written, the row as it is now). Idempotent: a retry after a lost reply
    finds its own write and reports it written.
    """
    result = json_text("effect result", effect.result)
    params: dict[str, Any] = {
        "key": effect.key,
        "run_id": effect.run_id,
        "step_no": effect.step_no,
        "status": effect.status,
        "result": result,
        "now": time.time(),
        "expected": expected,
    }
    if expected is None:
        changed = tx.execute(
            "INSERT INTO effects (key, run_id, step_no, status, result, updated_at) "
            "VALUES (:key, :run_id, :step_no, :status, :result, :now) "
            "ON CONFLICT (key) DO NOTHING",
            params,
        )
    else:
        changed = tx.execute(
            "UPDATE effects SET run_id = :run_id, step_no = :step_no, status = :status, "
            "result = :result, updated_at = :now WHERE key = :key AND status = :expected",
            params,
        )
    found = tx.fetchall("SELECT * FROM effects WHERE key = :key", params)
    current = rows.effect_from(found[0]) if found else None
    if changed:
        return True, current
    # Compared as stored: text sanitized, the result through its JSON round trip, so a
    # retry of a write holding a NUL or a lone surrogate still recognises itself.
    wanted = (clean_text(effect.run_id), effect.step_no, clean_text(effect.status))
    mine = (
        current is not None
        and (current.run_id, current.step_no, current.status) == wanted
        and current.result == loads(result)
    )
    return mine, current
