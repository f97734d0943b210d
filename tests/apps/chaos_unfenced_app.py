"""``chaos_app`` on a runtime whose journal fence was deleted: the attack the fence stops.

Imported by the chaos test's workers in place of the real app, it removes the lease
epoch and owner comparison from every journal batch's fence (``journal._fence``), as the
fence tests do by hand: a worker frozen past its lease, then thawed, has its writes
accepted while another worker owns the run. ``agentledger chaos`` must report them.
"""

from __future__ import annotations

from typing import Any

from agentledger.store._queries import journal
from tests.apps.chaos_app import app

__all__ = ["app"]

_fenced = journal._fence


def _unfenced(*args: Any) -> tuple[str, dict[str, Any]]:
    sql, params = _fenced(*args)
    return sql.replace(" AND lease_epoch = :epoch AND lease_owner = :owner", ""), params


journal._fence = _unfenced
