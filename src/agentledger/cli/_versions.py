"""`agentledger versions`: each agent and workflow version, its runs by state and the live
workers that serve it (docs/architecture.md, "Versions").

A version with unfinished runs and no live worker is flagged: those runs wait until a
worker of that version starts (the same judgement `runs list` shows per run).
"""

from __future__ import annotations

from typing import Any

import click
from rich import box
from rich.table import Table

from agentledger.cli._common import db_option, json_option, print_json, run_async, with_store
from agentledger.cli._routing import LIVE_WITHIN, version_key
from agentledger.cli._text import cell, console, visible
from agentledger.records import RunStatus, WorkerInfo, target_of
from agentledger.store import Store

OPEN = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING)
NO_WORKER = "no live worker"


def version_rows(
    counts: list[dict[str, Any]], registered: list[dict[str, Any]], workers: list[WorkerInfo]
) -> list[dict[str, Any]]:
    """One row per version (name@version): its runs by state, the live workers serving
    it, and a flag when runs are left and no live worker has the version."""
    rows: dict[str, dict[str, Any]] = {}

    def row(name: str, version: str, kind: str) -> dict[str, Any]:
        target = target_of(name, version)
        return rows.setdefault(
            target,
            {"target": target, "name": name, "version": version, "kind": kind,
             "runs": {}, "workers": [], "flag": None},
        )  # fmt: skip

    for r in registered:
        row(str(r["name"]), str(r["version"]), str(r["kind"]))
    for c in counts:
        found = row(str(c["name"]), str(c["version"]), str(c["kind"]))
        found["runs"][str(c["status"])] = int(c["runs"])
    for w in workers:
        for target in w.targets:
            if target in rows:
                draining = " (draining)" if w.draining else ""
                rows[target]["workers"].append(f"{w.host}:{w.pid}{draining}")
    for found in rows.values():
        left = sum(found["runs"].get(s, 0) for s in OPEN)
        if left and not found["workers"]:
            runs = "1 unfinished run waits" if left == 1 else f"{left} unfinished runs wait"
            found["flag"] = f"{NO_WORKER}: {runs}"
    return sorted(rows.values(), key=lambda r: (r["name"], version_key(r["version"])))


@click.command("versions")
@db_option
@json_option
@run_async
async def versions(db: str, as_json: bool) -> None:
    """Each agent and workflow version: its runs by state and the live workers serving it.
    A version with unfinished runs and no live worker is flagged (start a worker with that
    version, or cancel its runs). Drain an old version with `worker --exit-when-drained`."""

    async def go(store: Store) -> list[dict[str, Any]]:
        counts = await store.version_counts()
        registered = await store.registrations()
        workers = await store.list_workers(live_within=LIVE_WITHIN)
        return version_rows(counts, registered, workers)

    found = await with_store(db, go, read_only=True)
    if as_json:
        print_json(found)
        return
    if not found:
        click.echo("none")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("version", no_wrap=True, overflow="fold")
    table.add_column("kind", no_wrap=True, overflow="fold")
    for state in OPEN:
        table.add_column(state, justify="right", no_wrap=True)
    table.add_column("done", justify="right", no_wrap=True)
    table.add_column("workers", min_width=7, overflow="fold")
    for r in found:
        finished = sum(n for s, n in r["runs"].items() if s not in OPEN)
        table.add_row(
            cell(r["target"]),
            cell(r["kind"]),
            *(str(r["runs"].get(s, 0)) for s in OPEN),
            str(finished),
            cell(", ".join(r["workers"]) or "-"),
        )
    console().print(table)
    # The flags as whole lines, after the table: never folded into a narrow column.
    for r in found:
        if r["flag"]:
            click.echo(f"{visible(r['target'])}: {r['flag']}")
