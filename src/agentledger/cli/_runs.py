"""`agentledger runs ...` and `agentledger submit`: queue and inspect runs."""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich import box
from rich.table import Table

from agentledger.cli._common import (
    check_text,
    db_option,
    json_option,
    parse_json_input,
    print_json,
    run_async,
    with_store,
)
from agentledger.cli._routing import (
    LIVE_WITHIN,
    check_known,
    choose_version,
    version_key,
    versions_of,
)
from agentledger.cli._tables import audit_view, journal_notes, journal_view
from agentledger.cli._text import cell, console, json_safe, markup_safe
from agentledger.errors import UsageError
from agentledger.records import Approval, Run, RunStatus, WorkerInfo, error_parts
from agentledger.store import DEFAULT_URL, NewRun, Store
from agentledger.worker._liveness import is_dead_local_owner


def run_dict(run: Run, serving: set[str] | None = None) -> dict[str, Any]:
    data = dict(run.__dict__)
    if serving is not None and not run.terminal:
        data["worker_available"] = run.target in serving
    return data


@click.command("submit")
@click.argument("name")
@click.option("--input", "input_json", default="{}", help="The run's input as JSON.")
@click.option(
    "--version",
    default=None,
    help="Version to run [default: the newest version a live worker has]; given "
    "explicitly, the run is queued even when no live worker has it yet.",
)
@click.option(
    "--app",
    "app_path",
    envvar="AGENTLEDGER_APP",
    default=None,
    help="module:attr of the App, to check NAME against it.",
)
@click.option(
    "--tenant", default="default", show_default=True, help="The tenant the run belongs to."
)
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
    """Queue a run of agent or workflow NAME and print its id.

    Without --version it runs the newest version a live worker has. When no live
    worker has any version of NAME: with --app, the app's newest version is queued for
    the next worker (with a note); without, nothing is queued and the reason is printed.
    """
    for value, option in ((name, "NAME"), (version, "--version"), (tenant, "--tenant"),
                          (user, "--user")):  # fmt: skip
        check_text(value, option)
    payload = parse_json_input(input_json)
    # Imported here: the app (and the models it imports) only when --app names one.
    from agentledger._app import load_app

    app = load_app(app_path) if app_path else None
    if app is not None:  # before the database is opened (or created)
        check_known(name, version, app.targets(), f"in {app_path}")

    async def go(store: Store) -> tuple[str, str, bool]:
        if app is not None:
            targets = app.targets()
            where = f"in {app_path}"
        else:
            targets = {str(r["target"]): str(r["kind"]) for r in await store.registrations()}
            where = "registered by workers"
        known = versions_of(name, targets)
        workers = await store.list_workers(live_within=LIVE_WITHIN)
        live = {
            t.rpartition("@")[2] for w in workers for t in w.targets if t.rpartition("@")[0] == name
        }
        wanted = version
        if wanted is None and app is not None and known and not live & set(known):
            # --app names the code to run: queue its newest version for the next worker
            # (submit, then `worker --burst`). Without --app, a version no live worker has
            # is refused: the newest one ever registered may be a stopped canary.
            wanted = max(known, key=version_key)
        chosen, kind, served = choose_version(name, wanted, targets, live, where)
        if app is not None:
            run_id = await app.submit(
                store, name, payload, version=chosen, tenant_id=tenant, user_id=user
            )
        else:
            run = await store.create_run(
                NewRun(
                    kind=kind,
                    name=name,
                    version=chosen,
                    input=payload,
                    tenant_id=tenant,
                    user_id=user,
                )
            )
            run_id = run.id
        return run_id, chosen, served

    run_id, chosen, served = await with_store(db, go, create=True)
    click.echo(run_id)
    if not served:
        click.echo(
            f"note: no live worker has {name}@{chosen}; the run waits until one starts",
            err=True,
        )


@click.group("runs")
def runs() -> None:
    """List, show, cancel and resume runs."""


@runs.command("list")
@click.option(
    "--status",
    type=click.Choice(RunStatus.ALL),
    default=None,
    help="Only runs in this state.",
)
@click.option("--name", default=None, help="Only runs of this agent or workflow.")
@click.option("--limit", default=50, show_default=True, help="At most this many runs.")
@click.option("--stuck", is_flag=True, help="Only stuck runs (no progress, crash loop, no worker).")
@db_option
@json_option
@run_async
async def list_runs(
    status: str | None, name: str | None, limit: int, db: str, as_json: bool, stuck: bool = False
) -> None:
    """Runs, newest first. Non-terminal runs show whether a live worker has their version."""

    async def go(store: Store) -> tuple[list[Run], list[WorkerInfo], list[Approval]]:
        found = await store.list_runs(status=status, name=name, limit=limit)
        if stuck:  # observe/_stuck.py decides what is stuck
            from agentledger.observe._stuck import stuck_runs

            found = [r for r in await stuck_runs(store, name, limit) if status in (None, r.status)]
        return found, await store.list_workers(), await store.get_approvals(pending=True)

    found, workers, pending = await with_store(db, go, read_only=True)
    now = time.time()
    serving = {t for w in workers if now - w.heartbeat_at <= LIVE_WITHIN for t in w.targets}
    if as_json:
        print_json(
            [
                {**run_dict(r, serving), "note": run_note(r, serving, workers, pending, now)}
                for r in found
            ]
        )
        return
    if not found:  # an empty table reads as a rendering fault
        click.echo("none")
        return
    out = console()
    wide = out.width >= 110  # narrower: tokens, cost and resumes are in `runs show`
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("run", no_wrap=True, overflow="fold")
    table.add_column("target", overflow="fold")
    table.add_column("status", no_wrap=True, overflow="fold")
    numbers = ("steps", "tokens", "cost $", "resumes", "age") if wide else ("steps", "age")
    for header in numbers:
        table.add_column(header, justify="right", no_wrap=True, overflow="fold")
    table.add_column("note", overflow="fold")
    for r in found:
        figures = {
            "steps": str(r.step_count),
            "tokens": str(r.tokens) + (" sim" if r.usage_simulated else ""),
            "cost $": f"{r.cost_usd:.4f}" + (" sim" if r.usage_simulated else ""),
            "resumes": str(r.resumes),
            "age": f"{now - r.created_at:.0f}s",
        }
        note = run_note(r, serving, workers, pending, now)
        table.add_row(
            cell(r.id), cell(r.target), cell(r.status), *(figures[h] for h in numbers), cell(note)
        )
    out.print(table)


def owner_note(run: Run, workers: list[WorkerInfo], now: float) -> str:
    """What the liveness data says about the worker holding a running run's lease.

    Said as soon as it is known: the owner's process has ended (same host), its lease
    has expired, or its heartbeats stopped (two heartbeat intervals missed; a worker
    renews its leases and its heartbeat together, every third of its lease).
    """
    owner = run.lease_owner
    if run.status != RunStatus.RUNNING or not owner:
        return ""
    short = owner.split(".")[0]  # host:pid:start:nonce; the rest is the boot and namespace
    if is_dead_local_owner(owner):
        return f"worker {short} is gone (its process ended); the next claim resumes the run"
    if run.lease_expires_at is not None and run.lease_expires_at <= now:
        ago = now - run.lease_expires_at
        return f"lease expired {ago:.0f} s ago (worker {short}); the next claim resumes the run"
    info = next((w for w in workers if w.id == owner), None)
    if info is None:
        return ""
    silent = now - info.heartbeat_at
    lease = (run.lease_expires_at or now) - info.heartbeat_at
    if lease > 0 and silent > 2 * lease / 3 + 0.5:
        left = (run.lease_expires_at or now) - now
        return (
            f"worker {short} is gone (no heartbeat for {silent:.0f} s); "
            f"its lease expires in {left:.0f} s"
        )
    return ""


def run_note(
    run: Run, serving: set[str], workers: list[WorkerInfo], pending: list[Approval], now: float
) -> str:
    """The note column of ``runs list``: why a run is where it is."""
    note = run.failure or run.handover_reason or ""
    if run.status == RunStatus.WAITING:
        waits = [a for a in pending if a.run_id == run.id]
        if waits:
            a = waits[-1]
            note = f"waiting for approval {a.id} (role {a.required_role}) on {a.tool}"
        elif run.available_at:
            note = "waits until " + time.strftime(
                "%Y-%m-%d %H:%M:%S", time.localtime(run.available_at)
            )
    note = owner_note(run, workers, now) or note
    if run.cancel_requested and not run.terminal:
        note = f"cancel requested: {run.cancel_requested}"
    if not run.terminal and run.target not in serving:
        lack = f"no live worker has {run.target}"
        note = f"{note}; {lack}" if note else lack
    return note


@runs.command("show")
@click.argument("run_id")
@click.option("-v", "--verbose", is_flag=True, help="Also show a failed run's traceback.")
@db_option
@json_option
@run_async
async def show_run(run_id: str, db: str, as_json: bool, verbose: bool = False) -> None:
    """A run and its journal (with the lease epoch that wrote each step).

    A run handed to a person opens with the operator's reason, then the message its
    user was given; a failed run shows its error message (its traceback with -v).
    """

    async def go(
        store: Store,
    ) -> tuple[Run | None, list[Any], list[Any], list[Approval], dict[int, dict[str, Any]]]:
        run = await store.get_run(run_id)
        if run is None:
            return None, [], [], [], {}
        return (
            run,
            await store.load_journal(run_id),
            await store.list_events(run_id),
            await store.get_approvals(run_id=run_id, pending=True),
            await journal_notes(store, run_id),
        )

    run, steps, events, pending, notes = await with_store(db, go, read_only=True)
    by_operator = sum(1 for e in events if e.type == "run.resumed")
    if run is None:
        raise UsageError(f"no run {run_id!r}; list runs with `agentledger runs list`")
    if as_json:
        print_json(
            {
                "run": {**run_dict(run), "operator_resumes": by_operator},
                "steps": [{**s.to_dict(), **notes.get(s.step_no, {})} for s in steps],
                "events": [e.__dict__ for e in events],
            }
        )
        return
    out = console()
    out.print(f"[bold]{markup_safe(run.id)}[/] {markup_safe(run.target)} [bold]{run.status}[/]")
    simulated = " (simulated: a scripted model answered)" if run.usage_simulated else ""
    out.print(
        f"steps={run.step_count} tokens={run.tokens} cost=${run.cost_usd:.4f}{simulated} "
        f"epoch={run.lease_epoch} {resumes_text(run.resumes, by_operator)}",
        soft_wrap=True,  # one line: its figures are read (and grepped) together
    )
    from agentledger import _envsettings as envsettings  # loads pydantic-settings

    db_flag = "" if db in (DEFAULT_URL, envsettings.current().db) else f" --db {db}"
    for line in run_story(run, verbose, db_flag):
        out.print(line, soft_wrap=True)
    if getattr(run, "cancel_requested", None) and not run.terminal:
        out.print(f"cancel requested: {markup_safe(run.cancel_requested)}")
    for a in pending:
        args = json.dumps(json_safe(a.arguments), ensure_ascii=False, default=str)
        out.print(
            f"waiting for approval {markup_safe(a.id)} (role {markup_safe(a.required_role)}) "
            f"on {markup_safe(a.tool)} {markup_safe(args)}"
        )
        out.print(
            f"  decide: agentledger approvals approve {markup_safe(a.id)} --by NAME{db_flag}"
            f"   (or: approvals reject)",
            soft_wrap=True,  # a command to copy: never broken across lines
        )
    out.print(journal_view(steps, out.width, notes=notes))
    rows = []
    for e in events:
        stamp = time.strftime("%H:%M:%S", time.localtime(e.at)) + f".{int(e.at * 1000) % 1000:03d}"
        data = e.data if verbose else without_traceback(e.data)
        detail = json.dumps(json_safe(data), default=str) if data is not None else ""
        rows.append((stamp, e.type, e.actor, detail))
    out.print(audit_view(rows, out.width))


def resumes_text(takeovers: int, by_operator: int) -> str:
    """A run's resumes: by other workers after one was lost (the count an operator's
    resume starts again from 0) and by operators (``runs resume``), said apart."""
    if not by_operator:
        return f"resumes={takeovers}"
    return f"resumes={takeovers + by_operator} ({by_operator} by an operator)"


def run_story(run: Run, verbose: bool, db_flag: str = "") -> list[str]:
    """The lines under a run's header in ``runs show`` (markup-safe): for a run handed to
    a person the operator's reason first, then what its user was told; for a failed run
    its message, line by line, and its traceback only when ``verbose``."""
    lines: list[str] = []
    if run.status == RunStatus.NEEDS_HUMAN:
        if run.handover_reason:
            lines.append(f"reason: {markup_safe(run.handover_reason)}")
        if run.error:
            lines.append(f"message to the user: {markup_safe(run.error)}")
        return lines
    message, trace = error_parts(run.error)
    if run.status == RunStatus.FAILED and run.handover_reason:
        lines.append(f"error class: {markup_safe(run.handover_reason)}")
    elif run.handover_reason:
        lines.append(f"reason: {markup_safe(run.handover_reason)}")
    if message:
        first, *rest = message.split("\n")
        lines.append(f"error: {markup_safe(first)}")
        lines.extend(f"       {markup_safe(line)}" for line in rest)
    if trace and verbose:
        lines.extend(markup_safe(line) for line in trace.split("\n"))
    elif trace:
        where = markup_safe(f"{run.id}{db_flag}")
        lines.append(f"       (traceback: agentledger runs show {where} -v)")
    return lines


def without_traceback(data: Any) -> Any:
    """An event's data as ``runs show`` prints it without -v: no traceback, the run's
    error cut to its message."""
    if not isinstance(data, dict):
        return data
    data = {k: v for k, v in data.items() if k != "traceback"}
    ended = data.get("run")
    if isinstance(ended, dict) and isinstance(ended.get("error"), str):
        data["run"] = {**ended, "error": error_parts(ended["error"])[0]}
    return data


@runs.command("cancel")
@click.argument("run_id")
@click.option(
    "--reason", default="cancelled by operator", show_default=True, help="Recorded with it."
)
@db_option
@run_async
async def cancel(run_id: str, reason: str, db: str) -> None:
    """Cancel a run. A run that never started is cancelled at once; a started one gets a
    cancel request: its worker stops it at the next step boundary and compensates."""
    check_text(reason, "--reason", limit=1000)

    async def go(store: Store) -> tuple[Run | None, Run, set[str]]:
        before = await store.get_run(run_id)
        if before is None:
            raise UsageError(f"no run {run_id!r}; list runs with `agentledger runs list`")
        after = await store.cancel_run(run_id, reason, "cli")
        workers = await store.list_workers(live_within=LIVE_WITHIN)
        return before, after, {t for w in workers for t in w.targets}

    before, after, serving = await with_store(db, go)
    click.echo(cancel_message(before, after, serving))


def cancel_message(before: Run | None, after: Run, serving: set[str]) -> str:
    """What ``runs cancel`` did, in one line."""
    if after.status == RunStatus.CANCELLED and not (before and before.terminal):
        return f"{after.id} cancelled now"
    if after.terminal:
        return f"{after.id} is already {after.status}; nothing to cancel"
    line = (
        f"{after.id} cancel requested: its worker stops it at the next step boundary "
        "and compensates what it did"
    )
    if after.target not in serving:
        line += f" (no live worker has {after.target} now: it stops when one claims it)"
    return line
