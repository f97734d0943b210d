"""``agentledger soak``: hours of mixed load on worker processes under kills and
PostgreSQL restarts, sampled over time (implementation in :mod:`agentledger._chaos.soak`)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import click

from agentledger._app import load_app
from agentledger._chaos.session import Settings
from agentledger._chaos.soak import SoakSettings, run_soak
from agentledger._extras import ExtraNotInstalled, hint, missing
from agentledger.cli._chaos import finish_session, proxies_and_faults, read_inputs
from agentledger.cli._common import _check_db_url
from agentledger.cli._routing import check_known
from agentledger.errors import UsageError


def _loads(
    app: Any, app_path: str, agents: tuple[str, ...], files: tuple[str, ...]
) -> list[tuple[str, list[Any]]]:
    """Each agent with its inputs: one --inputs for all, or one per --agent in order."""
    if len(files) not in (1, len(agents)):
        raise UsageError(
            f"{len(agents)} --agent and {len(files)} --inputs: give one --inputs for all, "
            "or one per --agent in the same order"
        )
    loads = []
    for n, agent in enumerate(agents):
        path = files[n if len(files) > 1 else 0]
        inputs = read_inputs(path)
        check_known(agent, None, app.targets(), f"in {app_path}")
        for line, value in enumerate(inputs, 1):
            try:
                app.resolve(agent).validate_input(value)
            except UsageError as exc:
                raise UsageError(f"--inputs {path} line {line} ({agent}): {exc}") from None
        loads.append((agent, inputs))
    return loads


@click.command("soak")
@click.option("--app", "app_path", required=True, help="The app to run, MODULE:APP.")
@click.option(
    "--agent",
    "agents",
    multiple=True,
    required=True,
    help="An agent or workflow of the load (NAME); repeat it for a mix, submitted in turn.",
)
@click.option(
    "--inputs",
    "input_files",
    multiple=True,
    required=True,
    help="A JSONL file of run inputs, one a line: one for every --agent, or one per --agent.",
)
@click.option(
    "--hours",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="How long to submit the load, in hours.",
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="How long to submit the load, in minutes (instead of --hours).",
)
@click.option(
    "--rate",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Runs submitted per second.",
)
@click.option(
    "--workers",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Worker processes running the load (one is SIGKILLed every --kill-every seconds).",
)
@click.option(
    "--concurrency",
    default=20,
    show_default=True,
    type=click.IntRange(min=1, max=10000),
    help="Runs each worker executes at once.",
)
@click.option(
    "--kill-every",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="SIGKILL a random worker holding runs every SECONDS and start a replacement (0: never).",
)
@click.option(
    "--db",
    default=None,
    callback=lambda ctx, p, v: _check_db_url(ctx, p, v) if v else v,
    help="Database URL (default: a private PostgreSQL cluster the command starts and removes).",
)
@click.option(
    "--pg-restart-every",
    default=None,
    type=click.FloatRange(min=0),
    help="Restart the private PostgreSQL cluster every SECONDS (0: never; default 600; "
    "not with --db).",
)
@click.option(
    "--proxy",
    "proxy_values",
    multiple=True,
    help="NAME=URL: a fault-injecting proxy in front of the provider at URL (as in "
    "`agentledger chaos`). Repeatable.",
)
@click.option("--faults", default="", help="Faults the proxies inject (as in `agentledger chaos`).")
@click.option(
    "--sample-every",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.2),
    help="Seconds between samples.",
)
@click.option(
    "--approve-after",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds an approval waits before the soak decides it.",
)
@click.option(
    "--reject-share",
    default=0.2,
    show_default=True,
    type=click.FloatRange(min=0, max=1),
    help="Share of the approvals the soak rejects.",
)
@click.option(
    "--leak-mb-per-hour",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Fail when the workers' total RSS grows faster than this over the second half "
    "(judged when that half lasts 10 minutes or more).",
)
@click.option(
    "--drain-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds to wait, after the load, for every run to be terminal or waiting.",
)
@click.option(
    "--lease-seconds",
    default=15.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="The workers' lease (the worker's own default: what production runs with).",
)
@click.option("--seed", default=7, show_default=True, help="Seed of kills and decisions.")
@click.option(
    "--out",
    "out_dir",
    default="soak",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for soak.csv and soak.svg.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary.")
def soak(
    app_path: str,
    agents: tuple[str, ...],
    input_files: tuple[str, ...],
    hours: float | None,
    minutes: float | None,
    rate: float,
    workers: int,
    concurrency: int,
    kill_every: float,
    db: str | None,
    pg_restart_every: float | None,
    proxy_values: tuple[str, ...],
    faults: str,
    sample_every: float,
    approve_after: float,
    reject_share: float,
    leak_mb_per_hour: float,
    drain_timeout: float,
    lease_seconds: float,
    seed: int,
    out_dir: str,
    as_json: bool,
) -> None:
    """Soak your app: a steady mixed load for hours under kills, sampled over time.

    Submits runs of the --agent agents at --rate per second for --hours (or --minutes) on
    --workers worker processes, SIGKILLs one every --kill-every seconds, restarts the
    private PostgreSQL cluster every --pg-restart-every seconds, decides the approvals the
    runs ask for (--reject-share of them rejected), and every --sample-every seconds
    writes a row to soak.csv in --out: the workers' RSS, runs completed per second, step
    latency p50/p95/p99, queue delay and depth, stuck runs, database size, dead outbox
    rows. Then it waits for every run to settle, checks the invariants of `agentledger
    chaos` over every run, draws soak.svg, and exits 1 on a violation or when the
    workers' total RSS grew faster than --leak-mb-per-hour over the second half.
    """
    if (hours is None) == (minutes is None):
        raise UsageError("give the soak's length: --hours H or --minutes M (one of them)")
    seconds = hours * 3600 if hours is not None else (minutes or 0) * 60
    if db and pg_restart_every is not None:
        raise UsageError(
            "--pg-restart-every restarts only the private cluster: drop --db, or drop it"
        )
    if not db and missing("postgres"):
        raise ExtraNotInstalled(hint("postgres", "agentledger soak (without --db)"))
    proxies, fault_config = proxies_and_faults(proxy_values, faults)
    app = load_app(app_path)
    loads = _loads(app, app_path, agents, input_files)
    work_dir = Path(tempfile.mkdtemp(prefix="agentledger-soak-"))
    chaos = Settings(
        app_path=app_path,
        agent=agents[0],
        inputs=loads[0][1],
        workers=workers,
        kill_every=kill_every,
        db=db or "",
        proxies=proxies,
        faults=fault_config,
        seed=seed,
        timeout=drain_timeout,
        lease_seconds=lease_seconds,
        concurrency=concurrency,
        pg_private=not db,
        pg_restart_every=600.0 if pg_restart_every is None else pg_restart_every,
    )
    settings = SoakSettings(
        chaos=chaos,
        loads=loads,
        seconds=seconds,
        out=Path(out_dir),
        rate=rate,
        sample_every=sample_every,
        approve_after=approve_after,
        reject_share=reject_share,
        leak_mb_per_hour=leak_mb_per_hour,
    )
    finish_session(
        lambda: _run(settings, app, work_dir, as_json),
        work_dir,
        as_json,
        _print,
        f"interrupted; samples so far in {out_dir}; logs in {work_dir}",
    )


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table("figure", "value", title="soak")
    memory, leak = report["memory"], report["leak"]
    for label, value in (
        ("app", f"{report['app']} ({', '.join(report['agents'])})"),
        ("load", f"{report['seconds'] / 60:.1f} min at {report['rate']:g} runs/s"),
        ("submitted", report["submitted"]),
        ("runs by state", report["runs"]),
        ("workers killed / PostgreSQL restarts", f"{report['kills']} / {report['pg_restarts']}"),
        ("approvals decided", report["approvals"]),
        ("samples", report["samples"]),
        (
            "workers' RSS at the start and the end (MB)",
            f"{memory['start_total_mb']} -> {memory['end_total_mb']}",
        ),
        ("RSS slope, second half (MB/h)", f"{leak['slope_mb_per_hour']} ({leak['rule']})"),
        ("csv / svg", f"{report['csv']} / {report['svg']}"),
        ("elapsed (s)", report["elapsed_s"]),
    ):
        table.add_row(label, str(value))
    console.print(table)
    for q in report["latency_quarters"]:
        console.print(
            f"quarter {q['quarter']}: step p50 {q['step_p50_ms']} ms, p95 {q['step_p95_ms']} "
            f"ms, p99 {q['step_p99_ms']} ms (medians of {q['samples']} samples)"
        )
    for name, n in report["invariants"].items():
        console.print(f"{name}: [{'green' if n == 0 else 'red'}]{n}[/]")
    if report.get("gave_up"):
        console.print(f"[red]stopped:[/] {report['gave_up']}", soft_wrap=True)
    if leak["leaked"]:
        console.print(f"[red]leak:[/] {leak['slope_mb_per_hour']} MB/h; {leak['rule']}")
    for v in report["violations"]:
        console.print(f"[red]violation ({v['invariant']}):[/] {v['what']}", soft_wrap=True)
    if report["kept"]:
        console.print(f"worker logs kept in {report['kept']}", soft_wrap=True)
    console.print("[bold green]soak passed[/]" if report["ok"] else "[bold red]FAILED[/]")


def _run(settings: SoakSettings, app: Any, work_dir: Path, quiet: bool) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]soak"),
        BarColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[detail]}"),
        console=Console(stderr=True),
        disable=quiet,
        transient=True,
    )
    with progress:
        task = progress.add_task("soak", total=settings.seconds, detail="")

        def update(state: Any, pool: Any, row: dict[str, Any]) -> None:
            progress.update(
                task,
                completed=min(state.t(), settings.seconds),
                detail=f"submitted {state.submitted}, RSS {row['rss_total_mb']} MB, "
                f"p95 {row['step_p95_ms']} ms, queue {row['queue_depth']}, "
                f"killed {pool.kills}",
            )

        return asyncio.run(run_soak(settings, app, work_dir, update))
