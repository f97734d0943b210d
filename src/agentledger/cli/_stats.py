"""`agentledger stats`: the five numbers of the runs, from the store."""

from __future__ import annotations

import click
from rich import box
from rich.table import Table

from agentledger.cli._common import (
    check_text,
    db_option,
    json_option,
    print_json,
    run_async,
    with_store,
)
from agentledger.cli._text import cell, console
from agentledger.errors import UsageError
from agentledger.observe._stats import Stats, parse_since, stats
from agentledger.store import Store


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


@click.command("stats")
@click.option("--since", default="7d", show_default=True,
              help="Runs submitted in this window: 90s, 30m, 12h, 7d, 2w, or 'all'.")  # fmt: skip
@click.option("--agent", default=None, help="Only runs of this agent or workflow.")
@db_option
@json_option
@run_async
async def stats_command(since: str, agent: str | None, db: str, as_json: bool) -> None:
    """Completion rate, p50/p95 duration, cost per run, the failing steps (with the
    average cost and seconds of each failure) and stuck runs."""
    check_text(agent, "--agent")
    try:
        window = parse_since(since)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    async def go(store: Store) -> Stats:
        return await stats(store, window, agent)

    found = await with_store(db, go, read_only=True)
    if as_json:
        print_json(found.to_dict())
        return
    out = console()
    rate = "-" if found.completion_rate is None else f"{found.completion_rate:.1%}"
    scope = f"{agent or 'all agents'}, " + (f"last {since}" if window else "all time")
    out.print(f"[bold]{found.runs}[/bold] runs ({cell(scope)})")
    out.print(f"completion rate   {rate}  " + "  ".join(
        f"{s} {n}" for s, n in sorted(found.by_status.items())))  # fmt: skip
    out.print(f"duration          p50 {_seconds(found.p50_seconds)}  "
              f"p95 {_seconds(found.p95_seconds)}  (completed runs)")  # fmt: skip
    simulated = ""
    if found.simulated_runs:
        simulated = (f"; simulated: {found.simulated_runs} of {found.runs} runs were answered "
                     "by the scripted model")  # fmt: skip
    out.print(f"cost per run      {_money(found.cost_per_run_usd)}  "
              f"(total {_money(found.cost_usd)}, {found.tokens} tokens{simulated})")  # fmt: skip
    # The five numbers are always five lines: none failing is a figure too.
    failures = sum(int(row["failures"]) for row in found.failing_steps)
    out.print(f"failing steps     {failures or 'none'}")
    out.print(f"stuck runs        {len(found.stuck)}")
    if found.failing_steps:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="failing steps")
        table.add_column("step", overflow="fold")
        for header in ("failures", "avg cost", "avg seconds"):
            table.add_column(header, justify="right", no_wrap=True)
        for row in found.failing_steps:
            table.add_row(cell(row["step"]), str(row["failures"]), _money(row["avg_cost_usd"]),
                          _seconds(row["avg_seconds"]))  # fmt: skip
        out.print(table)
    if found.stuck:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="stuck runs")
        for header in ("run", "agent", "status", "reason", "idle"):
            table.add_column(header, overflow="fold")
        for s in found.stuck:
            table.add_row(cell(s["run_id"]), cell(s["name"]), cell(s["status"]),
                          cell(s["reason"]), _seconds(s["idle_seconds"]))  # fmt: skip
        out.print(table)
