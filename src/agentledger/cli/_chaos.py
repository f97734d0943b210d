"""``agentledger chaos``: run the user's own app on worker processes under failure and
check the invariants (implementation in :mod:`agentledger._chaos`)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from agentledger._app import load_app
from agentledger._chaos.faults import FAULT_KINDS, FaultConfig, Grammar, parse_faults
from agentledger._chaos.proxy import env_name
from agentledger._chaos.report import print_report
from agentledger._chaos.session import Settings, run_session
from agentledger._extras import ExtraNotInstalled, hint, missing
from agentledger.cli._common import _check_db_url
from agentledger.cli._routing import check_known
from agentledger.errors import UsageError

PROXY_KINDS = tuple(k for k in FAULT_KINDS if k not in ("decline", "lag", "keyless"))
"""The fault kinds a proxy injects (the others are the StayHub sandbox's own)."""


def read_inputs(path: str) -> list[Any]:
    """The run inputs of a JSONL file, one JSON value a line (blank lines skipped)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"--inputs {path}: {exc.strerror or exc}") from None
    inputs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            inputs.append(json.loads(line))
        except ValueError as exc:
            raise UsageError(f"--inputs {path} line {n} is not JSON: {exc}") from None
    if not inputs:
        raise UsageError(f"--inputs {path} has no input; write one JSON value a line")
    return inputs


def parse_proxies(values: tuple[str, ...]) -> dict[str, str]:
    """``NAME=URL`` options as {NAME: URL}."""
    found: dict[str, str] = {}
    for value in values:
        name, eq, url = value.partition("=")
        name = name.strip()
        if not eq or not name or not url.startswith(("http://", "https://")):
            raise UsageError(f"--proxy {value!r}: give NAME=URL, e.g. pay=http://127.0.0.1:9000")
        if not all(c.isalnum() or c in "_-." for c in name):
            raise UsageError(f"--proxy {value!r}: NAME takes letters, digits, '_', '-', '.'")
        if env_name(name) in {env_name(n) for n in found}:
            raise UsageError(f"--proxy {name} is given twice")
        found[name] = url
    return found


@click.command("chaos")
@click.option("--app", "app_path", required=True, help="The app to run, MODULE:APP.")
@click.option("--agent", "agent", required=True, help="The agent or workflow to run (NAME).")
@click.option(
    "--inputs",
    "inputs_path",
    required=True,
    help="A JSONL file of run inputs, one a line (cycled over the runs).",
)
@click.option(
    "--runs",
    "n_runs",
    default=20,
    show_default=True,
    type=click.IntRange(min=1),
    help="Runs to submit (at least 1).",
)
@click.option(
    "--workers",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="Worker processes (at least 1); a killed one is replaced.",
)
@click.option(
    "--concurrency",
    default=50,
    show_default=True,
    type=click.IntRange(min=1, max=10000),
    help="Runs each worker executes at once. Lower it so runs queue and kills land "
    "while they are in flight.",
)
@click.option(
    "--kill-every",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="SIGKILL a random worker holding runs every SECONDS and start a replacement (0: never).",
)
@click.option(
    "--freeze-every",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="SIGSTOP a random worker every SECONDS, past its lease, then SIGCONT it: a "
    "zombie that still believes it holds its runs (0: never; needs 2 workers).",
)
@click.option(
    "--db",
    default=None,
    callback=lambda ctx, p, v: _check_db_url(ctx, p, v) if v else v,
    help="Database URL (default: a fresh SQLite file in a temporary folder).",
)
@click.option(
    "--proxy",
    "proxy_values",
    multiple=True,
    help="NAME=URL: a fault-injecting proxy in front of the provider at URL; the workers "
    "find its address in $AGENTLEDGER_CHAOS_PROXY_<NAME>. Repeatable.",
)
@click.option(
    "--faults",
    default="",
    help="Faults the proxies inject: 'NAME:KIND[@P][,k=v...];...;seed=N'. KIND: "
    f"{', '.join(PROXY_KINDS)} (see docs/guide.md).",
)
@click.option(
    "--pg-private",
    is_flag=True,
    help="Run on a private PostgreSQL cluster the command starts (initdb in a temporary "
    "folder, a free port on 127.0.0.1) and removes at the end; needs the postgres extra "
    "and the server's binaries.",
)
@click.option(
    "--pg-restart-every",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Restart the --pg-private cluster every SECONDS under the workers (0: never).",
)
@click.option("--seed", default=7, show_default=True, help="Seed of the kill/freeze schedule.")
@click.option(
    "--timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds to wait for every run to be terminal or waiting.",
)
@click.option(
    "--lease-seconds",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="The workers' lease (a frozen worker is stopped longer than this).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for CI).")
def chaos(
    app_path: str,
    agent: str,
    inputs_path: str,
    n_runs: int,
    workers: int,
    concurrency: int,
    kill_every: float,
    freeze_every: float,
    db: str | None,
    proxy_values: tuple[str, ...],
    faults: str,
    pg_private: bool,
    pg_restart_every: float,
    seed: int,
    timeout: float,
    lease_seconds: float,
    as_json: bool,
) -> None:
    """Run your own agent or workflow on worker processes under failure, and check it.

    Submits --runs runs (inputs cycled from --inputs), starts --workers `agentledger
    worker` processes, kills and freezes them on schedule, injects provider faults through
    the --proxy proxies, waits until every run is terminal or waiting, then checks: every
    side effect at most once per key at its provider (counted at the proxies, and by tools
    that call agentledger.testing.chaos_effect); no succeeded step executed again; every
    run terminal or waiting; no write of a worker that lost its lease accepted; no run
    stuck; no step past its run's budget. Exit 1 on any violation, 2 on bad input.
    With --pg-private it runs on a PostgreSQL cluster of its own, restarted every
    --pg-restart-every seconds.
    """
    if pg_restart_every and not pg_private:
        raise UsageError(
            "--pg-restart-every restarts only a server the command started: add --pg-private"
        )
    if pg_private and db:
        raise UsageError("give --db or --pg-private, not both")
    if pg_private and missing("postgres"):
        raise ExtraNotInstalled(hint("postgres", "agentledger chaos --pg-private"))
    proxies, fault_config = proxies_and_faults(proxy_values, faults)
    inputs = read_inputs(inputs_path)
    app = load_app(app_path)
    check_known(agent, None, app.targets(), f"in {app_path}")
    for n, value in enumerate(inputs, 1):
        try:
            app.resolve(agent).validate_input(value)
        except UsageError as exc:
            raise UsageError(f"--inputs {inputs_path} line {n}: {exc}") from None
    work_dir = Path(tempfile.mkdtemp(prefix="agentledger-chaos-"))
    settings = Settings(
        app_path=app_path,
        agent=agent,
        inputs=inputs,
        runs=n_runs,
        workers=workers,
        kill_every=kill_every,
        freeze_every=freeze_every,
        db=db or f"sqlite:///{work_dir / 'chaos.db'}",
        proxies=proxies,
        faults=fault_config,
        seed=seed,
        timeout=timeout,
        lease_seconds=lease_seconds,
        concurrency=concurrency,
        pg_private=pg_private,
        pg_restart_every=pg_restart_every,
    )
    finish_session(
        lambda: _run(settings, app, work_dir, as_json),
        work_dir,
        as_json,
        print_report,
        f"interrupted; workers and proxies stopped; logs in {work_dir}",
    )


def proxies_and_faults(
    proxy_values: tuple[str, ...], faults: str
) -> tuple[dict[str, str], FaultConfig | None]:
    """``--proxy NAME=URL`` values and the ``--faults`` spec the proxies inject, checked
    (a UsageError naming the option otherwise)."""
    proxies = parse_proxies(proxy_values)
    grammar = Grammar(
        endpoints=tuple(proxies),
        kinds=PROXY_KINDS,
        example=f"{next(iter(proxies), 'pay')}:error_after_commit@0.2;seed=7",
    )
    if faults.strip() and not proxies:
        raise UsageError("--faults needs a --proxy NAME=URL to inject them at")
    try:
        return proxies, parse_faults(faults, grammar) if faults.strip() else None
    except ValueError as exc:
        raise UsageError(f"--faults: {exc}") from None


def finish_session(
    run: Callable[[], dict[str, Any]],
    work_dir: Path,
    as_json: bool,
    show: Callable[[dict[str, Any]], None],
    interrupted: str,
) -> None:
    """Run a chaos or soak session: SIGTERM stops it as Ctrl-C does (exit 130, saying
    ``interrupted``); a passing one removes ``work_dir``, a failing one keeps it (its
    database and the workers' logs tell what happened) and exits 1."""
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        report = run()
    except KeyboardInterrupt:
        click.echo(interrupted, err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if report["ok"]:
        shutil.rmtree(work_dir, ignore_errors=True)
    report["kept"] = None if report["ok"] else str(work_dir)
    if as_json:
        click.echo(json.dumps(report, default=str))
    else:
        show(report)
    if not report["ok"]:
        sys.exit(1)


def _run(settings: Settings, app: Any, work_dir: Path, quiet: bool) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]runs settled"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=quiet,
        transient=True,
    )
    with progress:
        task = progress.add_task("runs", total=settings.runs, detail="")

        def update(done: int, total: int, pool: Any) -> None:
            progress.update(
                task,
                completed=done,
                detail=f"workers {len(pool.running())}, killed {pool.kills}, frozen {pool.freezes}",
            )

        return asyncio.run(run_session(settings, app, work_dir, update))
