"""The journal as a table: one rendering for `runs show`, `demo` and `example`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agentledger.cli._text import cell, visible
from agentledger.store._sqlstore import Store

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


def journal_entry(step: Any, notes: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The fields of a journal entry a reader needs (a Step, or a dict of one), with
    what :func:`journal_notes` found for it (``waited_s``, ``delivery``)."""
    data = step if isinstance(step, dict) else step.to_dict()
    entry = {name: data.get(name) for name in JOURNAL_FIELDS}
    extra = (notes or {}).get(int(entry["step_no"] or 0), {})
    for name in ("waited_s", "delivery"):
        entry[name] = data.get(name, extra.get(name))
    # A scripted model's tokens and dollars are simulated: nobody counted or billed them.
    output = data.get("output")
    usage = output.get("usage") if isinstance(output, dict) else None
    derived = bool(isinstance(usage, dict) and usage.get("simulated"))
    entry["simulated"] = bool(data.get("simulated", derived))  # an entry read again keeps it
    return entry


def usage_text(entry: dict[str, Any], sep: str = " ") -> str:
    """A step's tokens and cost as a reader takes them, marked when simulated."""
    mark = " (simulated)" if entry.get("simulated") else ""
    return f"tokens={entry['tokens']}{sep}cost=${entry['cost_usd'] or 0:.5f}{mark}"


async def journal_notes(store: Store, run_id: str) -> dict[int, dict[str, Any]]:
    """Per step number, what a step's own figures do not hold: ``waited_s``, the wait
    for its approval's decision (a step's duration is its own work, the wait is not);
    ``delivery``, an outbox step's row ``{"status", "attempts"}`` (the step itself
    calls nothing: the dispatcher delivers)."""
    notes: dict[int, dict[str, Any]] = {}
    for a in await store.get_approvals(run_id=run_id):
        if a.decided_at is not None:
            wait = max(0.0, a.decided_at - a.requested_at)
            notes.setdefault(a.step_no, {})["waited_s"] = round(wait, 3)
    for item in await store.list_outbox(run_id=run_id):
        delivery = {"status": item.status, "attempts": item.attempts}
        notes.setdefault(item.step_no, {})["delivery"] = delivery
    return notes


def attempts_text(entry: dict[str, Any]) -> str:
    """The attempts of a step as a reader takes them: an outbox step's deliveries, "-"
    for a step that called nothing (refused before a call: denied, rejected, invalid)."""
    delivery = entry.get("delivery")
    if delivery:
        return f"{delivery['attempts']} {delivery['status']}"
    if not entry["attempts"] and entry["status"] in ("succeeded", "failed"):
        return "-"
    return str(entry["attempts"])


def duration_text(entry: dict[str, Any]) -> str:
    """A step's duration in ms, and the wait for its approval apart."""
    text = f"{entry['duration_ms'] or 0:.1f}"
    if entry.get("waited_s") is not None:
        text += f" +{entry['waited_s']:.1f} s approval"
    return text


def journal_table(
    steps: Iterable[Any], title: str | None = None, notes: dict[int, dict[str, Any]] | None = None
) -> Table:
    """Step, kind, name, status, attempts, key, duration, tokens, cost, epoch, error.

    Names, keys and errors come from models and providers: shown literally (no markup,
    control characters spelled out). Nothing is cut with an ellipsis: at 80 columns long
    cells fold onto more lines (keys last, so the short columns stay readable).
    """
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("step", "kind", "name", "status"):
        table.add_column(header, overflow="fold")
    table.add_column("att", justify="right", overflow="fold")
    table.add_column("key", overflow="fold")
    for header in ("ms", "tokens", "cost $", "epoch"):
        table.add_column(header, justify="right", overflow="fold")
    table.add_column("error", overflow="fold")
    for step in steps:
        s = journal_entry(step, notes)
        table.add_row(
            str(s["step_no"]),
            cell(s["kind"]),
            cell(s["name"]),
            cell(s["status"]),
            attempts_text(s),
            cell(s["idempotency_key"] or ""),
            duration_text(s),
            str(s["tokens"]) + (" sim" if s["simulated"] else ""),
            f"{s['cost_usd'] or 0:.5f}" + (" sim" if s["simulated"] else ""),
            str(s["lease_epoch"]),
            cell(s["error_class"] or ""),
        )
    return table


WIDE = 140  # below this many columns, journals and audit trails are shown as records


def journal_view(
    steps: Iterable[Any],
    width: int,
    title: str | None = None,
    notes: dict[int, dict[str, Any]] | None = None,
) -> RenderableType:
    """The journal for a terminal ``width`` columns wide: a table when it fits, else one
    record per step (its key on a line of its own), so nothing is ever cut. ``notes``:
    from :func:`journal_notes`."""
    if width >= WIDE:
        return journal_table(steps, title=title, notes=notes)
    lines: list[Text] = [Text(title, style="bold")] if title else []
    for step in steps:
        s = journal_entry(step, notes)
        line = Text(f"{s['step_no']:>3}  ")
        line.append(cell(s["kind"]))
        line.append("  ")
        line.append(visible(s["name"]), style="bold")
        line.append("  ")
        line.append(cell(s["status"]))
        line.append(
            f"  attempts={attempts_text(s)} epoch={s['lease_epoch']} {s['duration_ms'] or 0:.1f} ms"
        )
        if s.get("waited_s") is not None:
            line.append(f" (+{s['waited_s']:.1f} s waiting for approval)")
        if s["tokens"] or s["cost_usd"]:
            line.append(" " + usage_text(s))
        if s["error_class"]:
            line.append("  error=")
            line.append(cell(s["error_class"]))
        lines.append(line)
        if s["idempotency_key"]:
            lines.append(Text("     key ").append(cell(s["idempotency_key"])))
    return Group(*lines)


def audit_view(rows: Iterable[tuple[str, Any, Any, str]], width: int) -> RenderableType:
    """(at, event, actor, detail) rows: a table when it fits, else records."""
    if width >= WIDE:
        table = Table(title="audit trail", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("at", no_wrap=True)
        table.add_column("event", overflow="fold")
        table.add_column("actor", overflow="fold")
        table.add_column("detail", overflow="fold")
        for at, event, actor, detail in rows:
            table.add_row(at, cell(event), cell(actor), cell(detail))
        return table
    lines: list[Text] = [Text("audit trail", style="bold")]
    for at, event, actor, detail in rows:
        line = Text(f"{at}  ").append(visible(event), style="bold").append("  by ")
        lines.append(line.append(cell(actor)))
        if detail:
            lines.append(Text("    ").append(cell(detail)))
    return Group(*lines)
