"""`agentledger runs ...` and `agentledger submit`: queue and inspect runs."""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from agentledger.app import load_app
from agentledger.cli.common import (
    db_option,
    json_option,
    parse_json_input,
    print_json,
    run_async,
    with_store,
)
from agentledger.cli.tables import journal_table
from agentledger.errors import UnknownTargetError, UsageError
from agentledger.records import Run, RunStatus
from agentledger.store import NewRun, SQLStore


def run_dict(run: Run, serving: set[str] | None = None) -> dict[str, Any]:
    data = dict(run.__dict__)
    if serving is not None and not run.terminal:
        data["worker_available"] = run.target in serving
    return data


@click.command("submit")
@click.argument("name")
@click.option("--input", "input_json", default="{}", help="The run's input as JSON.")
@click.option("--version", default=None, help="Version to run (default: the newest known).")
@click.option(
    "--app",
    "app_path",
    envvar="AGENTLEDGER_APP",
    default=None,
    help="module:attr of the App, to check NAME against it.",
)
@click.option("--tenant", default="default", show_default=True)
@click.option("--user", default=None, help="The user the run acts for.")
@db_option
@run_async
async def submit(
    name: str,
    input_json: str,
    version: str | None,
    app_path: str | None,
    tenant: str,
    user: str | None,
    db: str,
) -> None:
    """Queue a run of agent or workflow NAME and print its id."""
    payload = parse_json_input(input_json)

    async def go(store: SQLStore) -> str:
        if app_path:
            return await load_app(app_path).submit(
                store, name, payload, version=version, tenant_id=tenant, user_id=user
            )
        kind, resolved = await _resolve_registered(store, name, version)
        run = await store.create_run(
            NewRun(
                kind=kind,
                name=name,
                version=resolved,
                input=payload,
                tenant_id=tenant,
                user_id=user,
            )
        )
        return run.id

    click.echo(await with_store(db, go))


async def _resolve_registered(store: SQLStore, name: str, version: str | None) -> tuple[str, str]:
    known = await store.registrations()
    matches = [
        r for r in known if r["name"] == name and (version is None or r["version"] == version)
    ]
    if not matches:
        listing = ", ".join(r["target"] for r in known) or "none yet"
        wanted = name if version is None else f"{name}@{version}"
        raise UnknownTargetError(
            f"unknown agent or workflow {wanted!r} (registered by workers: {listing}); "
            "start a worker with its app first, or pass --app module:app"
        )
    from agentledger.app import _version_key

    best = max(matches, key=lambda r: _version_key(r["version"]))
    return str(best["kind"]), str(best["version"])


@click.group("runs")
def runs() -> None:
    """List, show and cancel runs."""


@runs.command("list")
@click.option("--status", type=click.Choice(RunStatus.ALL), default=None)
@click.option("--name", default=None)
@click.option("--limit", default=50, show_default=True)
@db_option
@json_option
@run_async
async def list_runs(
    status: str | None, name: str | None, limit: int, db: str, as_json: bool
) -> None:
    """Runs, newest first. Non-terminal runs show whether a live worker has their version."""

    async def go(store: SQLStore) -> tuple[list[Run], set[str]]:
        found = await store.list_runs(status=status, name=name, limit=limit)
        workers = await store.list_workers(live_within=60)
        return found, {t for w in workers for t in w.targets}

    found, serving = await with_store(db, go)
    if as_json:
        print_json([run_dict(r, serving) for r in found])
        return
    table = Table("run", "target", "status", "steps", "tokens", "cost $", "resumes", "age", "note")
    now = time.time()
    for r in found:
        note = r.handover_reason or ""
        if r.status == RunStatus.WAITING and r.available_at:
            note = "waits until " + time.strftime(
                "%Y-%m-%d %H:%M:%S", time.localtime(r.available_at)
            )
        if not r.terminal and r.target not in serving:
            note = f"no live worker has {r.target}"
        table.add_row(
            r.id,
            r.target,
            r.status,
            str(r.step_count),
            str(r.tokens),
            f"{r.cost_usd:.4f}",
            str(r.resumes),
            f"{now - r.created_at:.0f}s",
            note,
        )
    Console().print(table)


@runs.command("show")
@click.argument("run_id")
@db_option
@json_option
@run_async
async def show_run(run_id: str, db: str, as_json: bool) -> None:
    """A run and its journal (with the lease epoch that wrote each step)."""

    async def go(store: SQLStore) -> tuple[Run | None, list[Any], list[Any]]:
        run = await store.get_run(run_id)
        if run is None:
            return None, [], []
        return run, await store.load_journal(run_id), await store.list_events(run_id)

    run, steps, events = await with_store(db, go)
    if run is None:
        raise UsageError(f"no run {run_id!r}; list runs with `agentledger runs list`")
    if as_json:
        print_json(
            {
                "run": run_dict(run),
                "steps": [s.to_dict() for s in steps],
                "events": [e.__dict__ for e in events],
            }
        )
        return
    console = Console()
    console.print(
        f"[bold]{run.id}[/] {run.target} [bold]{run.status}[/] steps={run.step_count} "
        f"tokens={run.tokens} cost=${run.cost_usd:.4f} epoch={run.lease_epoch} "
        f"resumes={run.resumes}"
    )
    if run.error or run.handover_reason:
        console.print(f"error: {run.error or ''}  reason: {run.handover_reason or ''}")
    console.print(journal_table(steps))
    audit = Table("at", "event", "actor", "detail", title="audit trail")
    for e in events:
        stamp = time.strftime("%H:%M:%S", time.localtime(e.at)) + f".{int(e.at * 1000) % 1000:03d}"
        detail = json.dumps(e.data, default=str) if e.data is not None else ""
        audit.add_row(stamp, e.type, e.actor, detail[:120])
    console.print(audit)


@runs.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="cancelled by operator")
@db_option
@run_async
async def cancel(run_id: str, reason: str, db: str) -> None:
    """Cancel a run; its worker's next write is refused."""
    run = await with_store(db, lambda s: s.cancel_run(run_id, reason, "cli"))
    click.echo(f"{run.id} {run.status}")
