"""The journal as a table: one rendering for `runs show`, `demo` and `example`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.table import Table

JOURNAL_FIELDS = (
    "step_no",
    "kind",
    "name",
    "status",
    "attempts",
    "idempotency_key",
    "duration_ms",
    "tokens",
    "cost_usd",
    "lease_epoch",
    "error_class",
)


def journal_entry(step: Any) -> dict[str, Any]:
    """The fields of a journal entry a reader needs (a Step, or a dict of one)."""
    data = step if isinstance(step, dict) else step.to_dict()
    return {name: data.get(name) for name in JOURNAL_FIELDS}


def journal_table(steps: Iterable[Any], title: str | None = None) -> Table:
    """Step, kind, name, status, attempts, key, duration, tokens, cost, epoch, error."""
    table = Table(
        "step", "kind", "name", "status", "attempts", "key", "ms", "tokens", "cost $", "epoch",
        "error", title=title,
    )  # fmt: skip
    for step in steps:
        s = journal_entry(step)
        table.add_row(
            str(s["step_no"]),
            s["kind"],
            s["name"],
            s["status"],
            str(s["attempts"]),
            s["idempotency_key"] or "",
            f"{s['duration_ms'] or 0:.1f}",
            str(s["tokens"]),
            f"{s['cost_usd'] or 0:.5f}",
            str(s["lease_epoch"]),
            s["error_class"] or "",
        )
    return table
