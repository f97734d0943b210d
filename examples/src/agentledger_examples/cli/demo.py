"""``agentledger demo``: StayHub bookings on real worker processes, with kills and faults.

Starts the sandbox (with ``--faults``; with ``--kill-every`` and no ``--faults``, the
:data:`DEFAULT_CHAOS` mix), W worker subprocesses, submits N booking runs (every tenth
guest cancels after paying: refund, then cancel), approves the bookings as a scripted
guest, optionally SIGKILLs a random worker every few seconds (starting a replacement),
waits for every run to be terminal and the outbox to drain, then prints runs by state,
steps, resumes, durations, cost, outbox deliveries, how often each fault fired and the
sandbox ledger's invariants. Exit code 1 when an invariant breaks, a run is not terminal
by ``--timeout``, an outbox row ended dead, or a configured fault met its operation and
never fired (a fault whose operation never came is reported, not a failure).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click

from agentledger import _envsettings as envsettings
from agentledger.cli._tables import journal_entry, journal_notes, journal_view
from agentledger.records import Run, RunStatus
from agentledger_examples.stayhub.sandbox.faults import grammar_help

DEFAULT_CHAOS = (
    "payments.create:error_after_commit@0.1,status=500,save=1;"
    "bookings.create:error_after_commit@0.1,status=502;"
    "payments.create:decline@0.15;"
    "payments.create:timeout_after_commit@0.25,hold=5;"
    "payments.refund:hold@0.5,hold=4;"
    "email:hold@0.2,hold=3;"
    "crm:keyless;"
    "search:rate_limit@0.1,retry_after=1,count=8;"
    "seed=7"
)
"""The faults of ``demo --kill-every`` when ``--faults`` is not given: payments and
bookings applied then answered 5xx (the payment's 500 saved and replayed for its key, as
Stripe does); declines, and payment answers lost after commit (some of them declines: a
lost failure); refunds and emails held past their tool timeout (a retry meets 409 request
in progress); a CRM that ignores idempotency keys and dedupes contacts by email with 409
(HubSpot); rate limits on search."""

CHAOS_TIMEOUTS = {
    "STAYHUB_PAYMENT_TIMEOUT": "3",
    "STAYHUB_BOOKING_TIMEOUT": "3",
    "STAYHUB_NOTIFY_TIMEOUT": "2",
}
"""Tool timeouts of the demo's workers unless the environment sets them: shorter than the
holds of :data:`DEFAULT_CHAOS`, so a held answer is lost to a timeout."""

CANCEL_EVERY = 10
"""Every tenth run's guest cancels after paying (a refund, then a cancellation)."""


@click.command("demo")
@click.option(
    "--runs",
    "n_runs",
    default=20,
    show_default=True,
    type=click.IntRange(min=1),
    help="Booking runs to submit (at least 1).",
)
@click.option(
    "--workers",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="Worker processes (at least 1).",
)
@click.option(
    "--kill-every",
    default=0.0,
    show_default=True,
    help=(
        "SIGKILL a random worker every SECONDS (0: never) and start a replacement. "
        "Without --faults this also installs the default chaos mix: "
        f"'{DEFAULT_CHAOS}'."
    ),
)
@click.option(
    "--faults",
    default=None,
    help=(
        "Sandbox faults, e.g. "
        "'payments.create:error_after_commit@0.1,save=1;email:keyless;seed=7'. "
        "Default: none, or the default chaos mix with --kill-every; '' for none. " + grammar_help()
    ),
)
@click.option(
    "--db",
    default=None,
    help="Database URL to keep the runs in, e.g. sqlite:///demo.db "
    "(default: a fresh SQLite file in a temporary folder, deleted at the end).",
)
@click.option("--seed", default=7, show_default=True, help="Seed for guests, cities and kills.")
@click.option(
    "--timeout",
    default=300.0,
    show_default=True,
    help="Seconds to wait for every run to be terminal.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def demo(
    n_runs: int,
    workers: int,
    kill_every: float,
    faults: str | None,
    db: str | None,
    seed: int,
    timeout: float,
    as_json: bool,
) -> None:
    """Book StayHub stays on worker processes and check the providers' ledger.

    By default: 20 booking runs on 2 workers, against a local sandbox with no faults and
    no kills, on a temporary SQLite database. --kill-every S SIGKILLs a random worker
    every S seconds (and, without --faults, installs the default chaos mix); --faults
    injects provider faults. A scripted guest approves each booking and each payment.

    Every tenth guest cancels after paying. The verdict fails when a ledger invariant
    breaks (double, orphan or wrong-amount charges, unpaid bookings, misaddressed or
    unwarranted emails, duplicate emails, CRM writes or bookings), a run is not terminal,
    an outbox row ended dead, or a configured fault met its operation and never fired
    (a fault no run gave a chance, e.g. a refund fault when no guest cancelled, is
    reported as not met).
    """
    from agentledger_examples.stayhub.sandbox import parse_faults

    if faults is None and kill_every > 0:
        faults = DEFAULT_CHAOS
    if faults:
        try:
            parse_faults(faults)
        except ValueError as exc:
            raise click.UsageError(f"--faults: {exc}") from None
    tmp = Path(tempfile.mkdtemp(prefix="agentledger-demo-"))
    url = db or f"sqlite:///{tmp / 'demo.db'}"
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        report = asyncio.run(
            _demo(n_runs, workers, kill_every, faults, url, seed, timeout, as_json, tmp)
        )
    except KeyboardInterrupt:
        click.echo("interrupted; workers and sandbox stopped", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if db is None and not envsettings.current().demo_keep:
            shutil.rmtree(tmp, ignore_errors=True)
    report["db_kept"] = db is not None or envsettings.current().demo_keep
    # The workers' logs stay with a kept database (they tell its runs' story); said
    # where, so nothing is left behind unsaid.
    report["worker_logs"] = str(tmp) if report["db_kept"] else None
    if as_json:
        click.echo(json.dumps(report, default=str))
    else:
        _print_tables(report)
    if not report["ok"]:
        sys.exit(1)


async def _demo(
    n_runs: int,
    workers: int,
    kill_every: float,
    faults: str | None,
    url: str,
    seed: int,
    timeout: float,
    as_json: bool,
    tmp: Path,
) -> dict[str, Any]:
    from agentledger.store import open_store
    from agentledger_examples.stayhub.app import app
    from agentledger_examples.stayhub.harness import (
        AGENT,
        WorkerPool,
        approve_as_guests,
        booking_input,
        percentile,
        wait_outbox_drained,
    )
    from agentledger_examples.stayhub.sandbox import INVARIANTS, SandboxServer, check_invariants

    rng = random.Random(seed)
    kill_rng = random.Random(seed + 1)
    started = time.monotonic()
    store = open_store(url)
    await store.open()
    sandbox = SandboxServer(faults=faults)
    pool: WorkerPool | None = None
    stop = asyncio.Event()
    approver: asyncio.Task[int] | None = None
    try:
        env = {k: os.environ.get(k, v) for k, v in CHAOS_TIMEOUTS.items()} if faults else {}
        # The workers start while the sandbox does (both take a while to import): no run
        # is submitted before the sandbox answers, so none calls it early.
        pool = WorkerPool(url, sandbox.url, size=workers, env=env, log_dir=tmp).start()
        sandbox.start()
        if sandbox.url != pool.stayhub_url:  # its port was taken: it moved to another
            pool.stop()
            pool = WorkerPool(url, sandbox.url, size=workers, env=env, log_dir=tmp).start()
        approver = asyncio.create_task(approve_as_guests(store, stop))
        ids = [
            await app.submit(
                store,
                AGENT,
                booking_input(
                    rng, i, "guest_cancels" if i % CANCEL_EVERY == CANCEL_EVERY - 1 else "normal"
                ),
                user_id=f"g-{1000 + i}",
            )
            for i in range(n_runs)
        ]
        states, killed = await _wait(store, ids, pool, kill_every, kill_rng, timeout, as_json)
        not_terminal = sum(1 for s in states.values() if s not in RunStatus.TERMINAL)
        outbox = await wait_outbox_drained(store, timeout=max(30.0, timeout / 4))
        stop.set()
        approvals = await approver
        runs = [r for r in [await store.get_run(i) for i in ids] if r is not None]
        effects = sandbox.ledger()
        ledger = check_invariants(effects)
        fault_stats = sandbox.fault_stats()
        # One run's journal, shown at the end: the one that resumed most, if any did.
        sample = max(runs, key=lambda r: (r.resumes, -r.created_at)) if runs else None
        journal = await store.load_journal(sample.id) if sample is not None else []
        notes = await journal_notes(store, sample.id) if sample is not None else {}
    finally:
        stop.set()
        if approver is not None and not approver.done():
            approver.cancel()
        if pool is not None:
            pool.stop()
        sandbox.close()
        await store.close()
    durations = [r.updated_at - r.created_at for r in runs if r.status == RunStatus.COMPLETED]
    by_state = Counter(r.status for r in runs)
    invariants = {k: ledger[k] for k in INVARIANTS}
    # A fault whose operation never came (no guest cancelled: no refund) had no chance
    # to fire: reported, not a failure. One that met its operation and never fired is.
    not_met = [f["fault"] for f in fault_stats["fired"] if f["fired"] == 0 and not f["met"]]
    never_fired = [f["fault"] for f in fault_stats["fired"] if f["fired"] == 0 and f["met"]]
    dead = outbox.get("dead", 0)
    ok = (
        not_terminal == 0
        and all(v == 0 for v in invariants.values())
        and dead == 0
        and not never_fired
    )
    return {
        "ok": ok,
        "runs": dict(sorted(by_state.items())),
        "submitted": n_runs,
        "not_terminal": not_terminal,
        "workers": workers,
        "kills": killed,
        "faults": faults,
        "steps": sum(r.step_count for r in runs),
        "resumes": sum(r.resumes for r in runs),
        "approvals": approvals,
        "duration_p50_s": _round(percentile(durations, 50)),
        "duration_p95_s": _round(percentile(durations, 95)),
        "tokens": sum(r.tokens for r in runs),
        "usage_simulated": any(r.usage_simulated for r in runs),
        "cost_usd": round(sum(r.cost_usd for r in runs), 6),
        "outbox": {s: outbox.get(s, 0) for s in ("delivered", "pending", "dead")},
        "ledger": {
            k: ledger[k]
            for k in ("bookings", "cancellations", "charges", "refunds", "crm_updates", "emails")
        },
        "invariants": invariants,
        "violations": ledger["violations"],
        "uncharged": _uncharged(runs, effects),
        "faults_fired": fault_stats["fired"],
        "faults_never_fired": never_fired,
        "faults_not_met": not_met,
        "responses_dropped": fault_stats["dropped"],
        "elapsed_s": round(time.monotonic() - started, 2),
        "db": url,
        "sample_run": None
        if sample is None
        else {
            "id": sample.id,
            "status": sample.status,
            "resumes": sample.resumes,
            "journal": [journal_entry(s, notes) for s in journal],
        },
    }


def _uncharged(runs: list[Run], effects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Completed runs the payments provider never charged, with the agent's answer: a run
    that gave up (a provider that kept failing, a sold-out hotel) says why here."""
    charged = {e.get("run_id") for e in effects if e.get("kind") == "charge"}
    return [
        {"run": r.id, "answer": r.result.get("answer") if isinstance(r.result, dict) else r.result}
        for r in runs
        if r.status == RunStatus.COMPLETED and r.id not in charged
    ]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def _wait(
    store: Any,
    ids: list[str],
    pool: Any,
    kill_every: float,
    rng: random.Random,
    timeout: float,
    quiet: bool,
) -> tuple[dict[str, str], int]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentledger_examples.stayhub.harness import wait_terminal

    deadline = time.monotonic() + timeout
    next_kill = time.monotonic() + kill_every if kill_every > 0 else float("inf")
    progress = Progress(
        TextColumn("[bold]bookings"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=quiet,
        transient=True,
    )
    with progress:
        task = progress.add_task("runs", total=len(ids), detail="")
        while True:
            states = await wait_terminal(store, ids, timeout=0)
            done = sum(1 for s in states.values() if s in RunStatus.TERMINAL)
            progress.update(
                task, completed=done, detail=f"workers {len(pool.alive())}, kills {pool.kills}"
            )
            if done == len(ids) or time.monotonic() > deadline:
                return states, pool.kills
            if time.monotonic() >= next_kill:
                pool.kill_random(rng)
                next_kill = time.monotonic() + kill_every
            await asyncio.sleep(0.1)


def _print_tables(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    runs = Table("state", "runs", title="runs by state")
    for state, n in report["runs"].items():
        runs.add_row(state, str(n))
    console.print(runs)
    figures = Table("figure", "value", title="figures")
    for label, key in (
        ("submitted", "submitted"),
        ("not terminal", "not_terminal"),
        ("workers", "workers"),
        ("workers killed", "kills"),
        ("faults", "faults"),
        ("total steps", "steps"),
        ("resumes", "resumes"),
        ("approvals (scripted guest)", "approvals"),
        ("p50 run duration (s)", "duration_p50_s"),
        ("p95 run duration (s)", "duration_p95_s"),
        ("tokens" + (" (simulated)" if report.get("usage_simulated") else ""), "tokens"),
        ("cost (USD" + (", simulated)" if report.get("usage_simulated") else ")"), "cost_usd"),
        ("elapsed (s)", "elapsed_s"),
    ):
        figures.add_row(label, str(report[key]))
    for status, n in report["outbox"].items():
        figures.add_row(f"outbox {status}", str(n))
    console.print(figures)
    ledger = Table("ledger", "count", title="sandbox ledger and invariants")
    for key, n in report["ledger"].items():
        ledger.add_row(key, str(n))
    for key, n in report["invariants"].items():
        ledger.add_row(key, f"[{'green' if n == 0 else 'red'}]{n}[/]")
    console.print(ledger)
    sample = report.get("sample_run")
    if sample:
        title = f"journal of run {sample['id']} ({sample['status']}, resumed {sample['resumes']}x)"
        console.print(journal_view(sample["journal"], console.width, title=title))
        if report.get("db_kept"):
            console.print(
                f"read it again: agentledger runs show {sample['id']} --db {report['db']}",
                soft_wrap=True,  # one line: a command to copy
            )
        else:
            console.print(
                "(the demo's temporary database is deleted; run it with --db sqlite:///demo.db "
                "to keep the runs and read them with `agentledger runs show`)"
            )
    if report.get("worker_logs"):
        console.print(
            f"worker logs: {report['worker_logs']}/worker-*.log (kept with the database; "
            "delete the folder when done)",
            soft_wrap=True,
        )
    if report["faults_fired"]:
        fired = Table("fault", "met", "fired", title="faults fired (answers dropped: see JSON)")
        for row in report["faults_fired"]:
            n, met = row["fired"], row["met"]
            colour = "green" if n else ("red" if met else "yellow")
            fired.add_row(row["fault"], str(met), f"[{colour}]{n}[/]")
        console.print(fired)
    for violation in report["violations"]:
        console.print(f"[red]violation:[/] {violation}")
    if report["outbox"]["dead"]:
        console.print(f"[red]dead outbox rows:[/] {report['outbox']['dead']}")
    for fault in report["faults_never_fired"]:
        console.print(f"[red]fault never fired:[/] {fault} (its operation came, the fault did not)")
    for fault in report["faults_not_met"]:
        console.print(
            f"[yellow]fault not met:[/] {fault} (no run reached its operation; "
            "not a failure: more runs give it a chance)"
        )
    console.print(
        "[bold green]all invariants hold, every fault that met its operation fired, "
        "no dead outbox row[/]"
        if report["ok"]
        else "[bold red]FAILED[/]"
    )
