"""Operator commands: worker, migrate, approvals, outbox, example."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import click

from agentledger import _heap as heap
from agentledger._clock import SYSTEM
from agentledger._extras import require
from agentledger.cli._common import (
    check_port_free,
    check_text,
    db_option,
    fail,
    json_option,
    print_json,
    run_async,
    with_store,
)
from agentledger.cli._text import cell, console, json_safe, visible
from agentledger.errors import UsageError
from agentledger.records import ApprovalDecision
from agentledger.store import Store, open_store
from agentledger.store._queries.approvals import SYSTEM_PREFIX
from agentledger.worker import _startup_signals as startup_signals
from agentledger.worker._companions import Companion
from agentledger.worker._config import WorkerConfig


@click.command("worker")
@click.option(
    "--app",
    "app_path",
    envvar="AGENTLEDGER_APP",
    required=True,
    help="module:attr of the App to run, e.g. agentledger_examples.stayhub.app:app",
)
@db_option
@click.option(
    "--concurrency", default=50, show_default=True, help="Runs executed at once (1 to 10000)."
)
@click.option(
    "--lease-seconds",
    default=15.0,
    show_default=True,
    help="How long a claim lasts without a heartbeat (0.5 to 86400); a dead worker's "
    "runs on another host resume after it.",
)
@click.option(
    "--heartbeat-seconds",
    default=None,
    type=float,
    help="How often leases are renewed, at most half the lease [default: a third of it].",
)
@click.option(
    "--poll-seconds",
    default=0.2,
    show_default=True,
    help="How often to look for runnable runs when not woken (0.01 to 3600).",
)
@click.option(
    "--shutdown-grace",
    default=10.0,
    show_default=True,
    help="On SIGTERM or SIGINT (Ctrl-C), how long runs may finish their current step "
    "before being released.",
)
@click.option(
    "--store-retry-seconds",
    default=10.0,
    show_default=True,
    help="How long a write the database refuses for its own reason (disk full, I/O "
    "error, read-only, connection lost) is retried before the run is given back to "
    "another worker; a --burst worker that gave a run back exits 1.",
)
@click.option("--no-outbox", is_flag=True, help="Do not deliver outbox rows in this process.")
@click.option(
    "--no-webhooks",
    is_flag=True,
    help="Do not deliver webhooks in this process (`serve` processes deliver them too).",
)
@click.option(
    "--no-reap",
    is_flag=True,
    help="Do not expire leases of dead workers on this host at once (wait for expiry).",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Exit 0 once nothing is left to run now (no due run of its targets, no dead "
    "worker's run to take over, no due outbox row); runs parked until later are left. "
    "Exit 1 when the database failed and runs were given back unfinished.",
)
@click.option(
    "--exit-when-drained",
    is_flag=True,
    help="Exit 0 once no run of this worker's versions is left in any unfinished state "
    "(queued, running, waiting): the old version's workers of a deploy.",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Also log every step (default: one line per run state)."
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per line, for log collectors.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus /metrics on this port (0: any free port).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the /metrics server listens on (0.0.0.0: every interface).",
)
@click.option(
    "--prune-every",
    type=float,
    default=None,
    help="Every this many seconds (1 to 604800), prune the tenants with a configured "
    "retention (`agentledger prune --set-retention`); one worker at a time does.",
)
def worker(
    app_path: str,
    db: str,
    concurrency: int,
    lease_seconds: float,
    heartbeat_seconds: float | None,
    poll_seconds: float,
    shutdown_grace: float,
    store_retry_seconds: float,
    no_outbox: bool,
    no_webhooks: bool,
    no_reap: bool,
    burst: bool,
    verbose: bool,
    log_format: str,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    prune_every: float | None = None,
    exit_when_drained: bool = False,
) -> None:
    """Claim and execute runs until SIGTERM (then release them and exit 0).

    Exits non-zero when it stops on an error it cannot recover from, so a process
    manager restarts it; a transient one (the database locked, a lost connection)
    is retried and never stops it.
    """
    # First thing: a SIGTERM while the app imports or the store opens exits 0.
    startup_signals.install()
    # Imported here, not with the module: the module's other commands (migrate,
    # approvals, outbox) and `worker --help` run no steps.
    from agentledger._app import load_app
    from agentledger.worker._runlog import configure_logging
    from agentledger.worker._worker import Worker, WorkerFailed

    try:
        config = WorkerConfig(
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            heartbeat_seconds=heartbeat_seconds,
            poll_seconds=poll_seconds,
            shutdown_grace=shutdown_grace,
            store_retry_seconds=store_retry_seconds,
            outbox=not no_outbox,
            webhooks=not no_webhooks,
            reap_dead_local_owners=not no_reap,
            prune_every=prune_every,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if metrics_port is not None:  # before the app loads or the database opens
        require("metrics", "agentledger worker --metrics-port")
        check_port_free(metrics_host, metrics_port, "--metrics-port", "--metrics-host")
    configure_logging(verbose=int(verbose), fmt=log_format)
    app = load_app(app_path)

    async def main() -> None:
        store = open_store(db)
        await store.open()
        metrics = None
        if metrics_port is not None:
            from agentledger.observe._metrics import start_metrics

            metrics = start_metrics(store, metrics_port, metrics_host)
        heap.freeze_startup()  # agentledger/_heap.py: full collections skip the start-up heap
        try:
            worker = Worker(
                store,
                app,
                config,
                burst=burst,
                exit_when_drained=exit_when_drained,
                companions=worker_companions(config),
            )
            await worker.run()
        finally:
            if metrics is not None:
                metrics.stop()
            with contextlib.suppress(Exception):  # the reason to stop is already raised
                await store.close()

    try:
        asyncio.run(main())
    except WorkerFailed as exc:
        fail(f"worker stopped: {exc}", code=1)


@click.command("migrate")
@click.option(
    "--status",
    "show_status",
    is_flag=True,
    help="List the applied and pending migrations, one a line; change nothing.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Exit 0 when the schema is current, 1 when migrations are pending (all online), "
    "3 when a pending one is offline (stop the workers first); change nothing.",
)
@db_option
@json_option
@run_async
async def migrate(show_status: bool, check: bool, db: str, as_json: bool) -> None:
    """Create or upgrade the schema (with --status or --check: only tell)."""
    from agentledger.store._sqlstore import redacted_url

    if show_status or check:
        await _migration_report(db, show_status=show_status, check=check, as_json=as_json)
        return

    async def go(store: Store) -> tuple[list[int], list[int]]:
        # Opening with create applied what was missing (store.applied).
        return store.applied, [version for version, _ in store.dialect.migrations()]

    applied, versions = await with_store(db, go, create=True)
    where, latest = redacted_url(db), max(versions)
    if as_json:
        print_json({"applied": applied, "version": latest})
    elif applied and min(versions) in applied:
        click.echo(f"schema created (version {latest}) in {where}")
    elif applied:
        click.echo(f"schema upgraded to version {latest} (applied {len(applied)}) in {where}")
    else:
        click.echo(f"schema up to date (version {latest}) in {where}")


async def _migration_report(db: str, *, show_status: bool, check: bool, as_json: bool) -> None:
    """``migrate --status`` / ``--check``: read the applied versions without migrating
    (a store with no schema yet lists every migration as pending)."""
    import datetime
    import os

    from agentledger.store._queries.migrations import migration_status
    from agentledger.store._sqlite import sqlite_path
    from agentledger.store._tx import Tx

    if db.startswith("sqlite:"):
        path = sqlite_path(db)[0]
        if path != ":memory:" and not os.path.exists(path):
            raise UsageError(f"no database at {path}; check --db")
    dialect = open_store(db).dialect

    def read() -> list[Any]:
        conn = dialect.connect()
        try:
            return migration_status(Tx(dialect, conn))
        finally:
            dialect.close(conn)

    found = await asyncio.to_thread(read)
    pending = [m for m in found if m.applied_at is None]
    if show_status and as_json:
        print_json([m.__dict__ for m in found])
    elif show_status:
        for m in found:
            if m.applied_at is None:
                state = f"pending, offline: {m.offline}" if m.offline else "pending, online"
            else:
                at = datetime.datetime.fromtimestamp(m.applied_at, datetime.UTC)
                state = f"applied {at.isoformat(timespec='seconds').replace('+00:00', 'Z')}"
                if not m.known:
                    state += " (by a newer release)"
            click.echo(f"{m.version:04d} {m.name or '?':<28} {visible(state)}")
    if not check:
        return
    if not pending:
        if not show_status:
            click.echo(f"schema current (version {max(m.version for m in found)})")
        return
    if len(pending) == len([m for m in found if m.known]):
        fail("no agentledger schema yet: create it with `agentledger migrate`", code=1)
    names = ", ".join(f"{m.version:04d}_{m.name}" for m in pending)
    offline = [m for m in pending if m.offline]
    if offline:
        why = "; ".join(f"{m.version:04d}: {m.offline}" for m in offline)
        fail(f"{len(pending)} pending migration(s): {names}; offline, stop the workers "
             f"before `agentledger migrate` ({why})", code=3)  # fmt: skip
    fail(f"{len(pending)} pending migration(s), all online: {names}; "
         "run `agentledger migrate`", code=1)  # fmt: skip


@click.group("approvals")
def approvals() -> None:
    """Pending approvals and decisions."""


@approvals.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include decided approvals.")
@db_option
@json_option
@run_async
async def list_approvals(show_all: bool, db: str, as_json: bool) -> None:
    """Pending approvals (with --all, decided ones too): the run, step, tool, role
    needed and the arguments the model proposed."""
    found = await with_store(db, lambda s: s.get_approvals(pending=not show_all), read_only=True)
    if as_json:
        print_json([a.__dict__ for a in found])
        return
    if not found:
        click.echo("none")
        return
    from rich import box  # loaded to print (the worker command never does)
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("approval", "run"):
        table.add_column(header, no_wrap=True, overflow="fold")
    for header in ("step", "tool", "role", "decision", "arguments"):
        table.add_column(header, overflow="fold")
    for a in found:
        # The tool and its arguments were proposed by a model: shown literally, control
        # characters spelled out, so nothing can be hidden from the approver.
        table.add_row(
            cell(a.id),
            cell(a.run_id),
            str(a.step_no),
            cell(a.tool),
            cell(a.required_role),
            cell(a.decision or "pending"),
            cell(json.dumps(json_safe(a.arguments), ensure_ascii=False, default=str)),
        )
    console().print(table)


def _decide(decision: str) -> Any:
    @click.argument("approval_id")
    @click.option("--by", "decided_by", required=True, help="Who decides (recorded).")
    @db_option
    @run_async
    async def command(approval_id: str, decided_by: str, db: str) -> None:
        check_text(decided_by, "--by")
        if decided_by.startswith(SYSTEM_PREFIX):
            # The expiry default's and cancel's namespace, exempt from the expiry rule
            # and the policy's conditions: a person is never recorded as one of them.
            raise UsageError(f"--by {decided_by!r}: names starting {SYSTEM_PREFIX!r} are reserved")
        # Judged on this machine's clock in the statement that records the decision: at
        # or after expiry nothing is recorded and the command fails (ApprovalExpired).
        a = await with_store(
            db, lambda s: s.decide_approval(approval_id, decision, decided_by, SYSTEM)
        )
        if a.decision is None:  # a vote of an approval needing several approvers
            left = a.approvals_needed - len(a.approvers)
            click.echo(
                f"{a.id} {decision} by {visible(decided_by)} recorded; {left} more approver"
                f"{'s' if left != 1 else ''} needed"
            )
            return
        click.echo(f"{a.id} {a.decision} by {visible(a.decided_by)}; run {a.run_id} re-queued")

    command.__doc__ = (
        f"{decision.capitalize()} a pending approval (refused, and nothing recorded, once "
        "it has expired by this machine's clock: the expiry's default decides)."
    )
    return command


approvals.command("approve")(_decide(ApprovalDecision.APPROVE))
approvals.command("reject")(_decide(ApprovalDecision.REJECT))


@click.group("outbox", invoke_without_command=True)
@click.option(
    "--app",
    "app_path",
    envvar="AGENTLEDGER_APP",
    default=None,
    help="module:attr of the App whose tools deliver the rows (needed to deliver).",
)
@db_option
@click.pass_context
def outbox(ctx: click.Context, app_path: str | None, db: str) -> None:
    """Deliver due outbox rows (needs --app), or inspect dead letters."""
    if ctx.invoked_subcommand is not None:
        return
    if not app_path:
        raise click.UsageError("pass --app module:app to deliver, or use `outbox dead`")
    from agentledger._app import load_app
    from agentledger._outbox import OutboxDispatcher
    from agentledger.worker._liveness import make_owner_id

    app = load_app(app_path)

    async def go(store: Store) -> int:
        await app.startup()
        try:
            return await OutboxDispatcher(store, app, make_owner_id()).drain()
        finally:
            await app.shutdown()

    handled = asyncio.run(with_store(db, go))
    click.echo(f"handled {handled} outbox rows")


@outbox.command("dead")
@db_option
@json_option
@run_async
async def outbox_dead(db: str, as_json: bool) -> None:
    """Dead letters: deliveries that exhausted their retries, with their history."""
    found = await with_store(db, lambda s: s.list_outbox("dead"), read_only=True)
    if as_json:
        print_json([i.__dict__ for i in found])
        return
    if not found:  # an empty table reads as a rendering fault
        click.echo("none")
        return
    from rich import box  # loaded to print (the worker command never does)
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("key", "run"):
        table.add_column(header, no_wrap=True, overflow="fold")
    for header in ("tool", "attempts", "last error"):
        table.add_column(header, overflow="fold")
    for i in found:
        table.add_row(
            cell(i.key), cell(i.run_id), cell(i.tool), str(i.attempts), cell(i.last_error or "")
        )
    console().print(table)


def worker_companions(config: WorkerConfig) -> list[Companion]:
    """The side tasks of an ``agentledger worker``: the stuck-run detector, and the
    webhook dispatcher unless ``--no-webhooks``.

    Every worker the commands start (``worker``, ``example``, the benchmarks) gets its
    side tasks here, so here its process also registers the gateway's hooks and the
    audit chain (``cli/_features.py``) before the worker starts."""
    from agentledger.cli import _features  # noqa: F401
    from agentledger.observe import _stuck as stuck

    found = [stuck.companion()]
    if config.webhooks:
        # Imported here: the service package loads what a worker with webhooks off
        # never needs.
        from agentledger.service import _webhooks as webhooks

        found.append(webhooks.companion())
    return found
