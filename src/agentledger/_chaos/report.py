"""The chaos report on a terminal: runs by state, the figures, each invariant, and every
violation in one line naming its run, step and key."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from agentledger._chaos.invariants import INVARIANTS

DESCRIPTIONS = {
    "effects_per_key": "every side effect at most once per key at its provider",
    "succeeded_step_executed_again": "no succeeded step executed again",
    "runs_settled": "every run terminal or waiting",
    "stale_lease_writes": "no write of a worker that lost its lease accepted",
    "no_stuck_runs": "no run stuck without a live lease",
    "spend_within_budget": "no step started past its run's budget",
}


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    """Print ``report`` (see ``session.run_session``) as tables."""
    console = console or Console()
    runs = Table("state", "runs", title="runs by state")
    for state, n in report["runs"].items():
        runs.add_row(state, str(n))
    console.print(runs)
    figures = Table("figure", "value", title="chaos")
    figures.columns[1].overflow = "fold"  # the app and the faults in full
    for label, value in (
        ("app", f"{report['app']} ({report['agent']})"),
        ("submitted", report["submitted"]),
        ("workers", report["workers"]),
        ("workers killed (SIGKILL)", report["kills"]),
        ("workers frozen past their lease (SIGSTOP)", report["freezes"]),
        ("workers that exited by themselves", len(report["worker_exits"])),
        ("PostgreSQL restarts (--pg-private)", report["pg_restarts"]),
        ("journal entries", report["steps"]),
        ("resumes", report["resumes"]),
        ("faults", report["faults"] or "none"),
        ("side effects counted (proxies / hook)", _effects(report["effects"])),
        ("timed out", report["timed_out"]),
        ("elapsed (s)", report["elapsed_s"]),
    ):
        figures.add_row(label, str(value))
    console.print(figures)
    if report["proxies"]:
        proxies = Table(
            "proxy",
            "upstream",
            "requests",
            "writes",
            "replays",
            "answers withheld",
            title="proxies",
        )
        for name, p in report["proxies"].items():
            proxies.add_row(
                f"{name} (${p['env']})",
                p["upstream"],
                str(p["requests"]),
                str(p["writes"]),
                str(p["replays"]),
                str(p["answers_withheld"]),
            )
        console.print(proxies)
    invariants = Table("invariant", "violations", title="invariants")
    for name in INVARIANTS:
        n = report["invariants"][name]
        invariants.add_row(DESCRIPTIONS[name], f"[{'green' if n == 0 else 'red'}]{n}[/]")
    console.print(invariants)
    for exit_ in report["worker_exits"]:
        console.print(
            f"[yellow]worker {exit_['pid']} exited by itself ({exit_['code']}):[/] "
            f"{exit_['last_line']}",
            soft_wrap=True,
        )
    if report.get("gave_up"):
        console.print(f"[red]stopped:[/] {report['gave_up']}", soft_wrap=True)
    for v in report["violations"]:
        console.print(f"[red]violation ({v['invariant']}):[/] {v['what']}", soft_wrap=True)
    if report.get("kept"):
        console.print(f"database and worker logs kept in {report['kept']}", soft_wrap=True)
    console.print("[bold green]all invariants hold[/]" if report["ok"] else "[bold red]FAILED[/]")


def _effects(effects: dict[str, int]) -> str:
    counted, keys = effects["counted"], effects["keys"]
    return f"{counted} on {keys} keys ({effects['at_proxies']} / {effects['by_hook']})"
