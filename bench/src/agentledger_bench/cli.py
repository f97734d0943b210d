"""``agentledger bench``: engine overhead against raw commits on the same disk."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table


def _fmt(value: Any, unit: str = "") -> str:
    if isinstance(value, float):
        text = f"{value:,.1f}" if abs(value) >= 10 else f"{value:,.3f}"
    else:
        text = f"{value:,}" if isinstance(value, int) else str(value)
    return f"{text}{unit}"


def _verdict(ok: bool) -> str:
    return "[green]met[/green]" if ok else "[red]missed[/red]"


def render(report: dict[str, Any], console: Console) -> None:
    raw = report["raw_commit_us"]
    table = Table(
        title=f"agentledger bench ({report['backend']}, "
        f"{report['machine']['cpus']} CPUs{', quick' if report['quick'] else ''})"
    )
    for column in ("figure", "median", "ratio to (a)", "target", ""):
        table.add_column(column, justify="left" if column == "figure" else "right")
    sizes = report["sizes"]
    steps = sizes["steps"]
    table.add_row(f"(a) raw INSERT+COMMIT ({report['backend']})", _fmt(raw, " µs"), "1.000", "", "")
    table.add_row(
        f"(b) read tool step, {steps}-step run",
        _fmt(report["read_step_us"], " µs"),
        _fmt(report["read_step_ratio"]),
        "≤ 1.5x",
        _verdict(report["read_step_ratio"] <= 1.5),
    )
    table.add_row(
        f"(b') ctx.step no-op, {steps}-step run",
        _fmt(report["ctx_step_us"], " µs"),
        _fmt(report["ctx_step_ratio"]),
        "",
        "",
    )
    table.add_row(
        f"(c) write tool step (2 commits), {steps}-step run",
        _fmt(report["write_step_us"], " µs"),
        _fmt(report["write_step_ratio"]),
        "≤ 2.5x",
        _verdict(report["write_step_ratio"] <= 2.5),
    )
    rate = report["concurrent_steps_per_s"]
    table.add_row(
        f"(d) {sizes['concurrent_runs']} runs x {sizes['concurrent_steps']} steps, one worker",
        _fmt(rate, " steps/s"),
        f"{_fmt(report['concurrent_over_raw_commits'])} x raw commits/s",
        "≥ 5,000/s",
        _verdict(rate >= 5000),
    )
    groups = report["group_sizes"]
    table.add_row(
        "    group commit batch size",
        f"median {_fmt(groups['median'])}",
        f"mean {_fmt(groups['mean'])}, max {groups['max']}",
        "",
        "",
    )
    _small, mid, large = report["bytes_sizes"]
    table.add_row(
        f"(e) growth {large} steps / {mid} steps",
        _fmt(report["bytes_growth_500_over_100"], "x"),
        "",
        "≤ 5.5x",
        _verdict(report["bytes_growth_500_over_100"] <= 5.5),
    )
    table.add_row(
        f"(e) stored bytes / payload ({large} steps)",
        _fmt(report["stored_bytes_over_payload"], "x"),
        f"{_fmt(report['bytes_per_step_500'])} B/step",
        "≤ 2x",
        _verdict(report["stored_bytes_over_payload"] <= 2.0),
    )
    for procs, value in report.get("process_throughput_steps_per_s", {}).items():
        table.add_row(f"    {procs} worker process(es)", _fmt(value, " steps/s"), "", "", "")
    resume = report.get("resume")
    if resume:
        for case, label in (("same_host", "same host"), ("other_host", "other host (lease)")):
            figures = resume[case]
            table.add_row(
                f"kill -> resumed step, {label}, {resume['kills']} kills",
                f"median {_fmt(figures['median_s'], ' s')}",
                f"max {_fmt(figures['max_s'], ' s')}",
                f"lease {resume['lease_seconds']:.0f} s" if case == "other_host" else "~1 s",
                "",
            )
    console.print(table)
    console.print(
        "Per-step figures are timed inside each run (first step start to last step "
        "committed); ratios are ratios of medians over interleaved repetitions. "
        "See docs/benchmarks.md."
    )


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def render_growth(report: dict[str, Any], console: Console) -> None:
    """The growth benchmark's table: each query before and after the fill."""
    from agentledger_bench.growth import QUERIES, TABLES

    table = Table(
        title=f"agentledger bench --growth ({report['backend']}, {report['steps']:,} steps in "
        f"{report['runs']:,} runs, {report['queued_runs']} queued; fill "
        f"{report['fill_seconds']:,.0f} s)"
    )
    for column in ("query", "before p50 / p95 / p99", "after p50 / p95 / p99", "p99 after/before"):
        table.add_column(column, justify="left" if column == "query" else "right")
    for query in QUERIES:
        b, a = report["before"][query], report["after"][query]
        if not b.get("n") or not a.get("n"):
            continue
        table.add_row(
            f"{query} (n={a['n']})",
            f"{b['p50_ms']:.2f} / {b['p95_ms']:.2f} / {b['p99_ms']:.2f} ms",
            f"{a['p50_ms']:.2f} / {a['p95_ms']:.2f} / {a['p99_ms']:.2f} ms",
            f"{a['p99_ms'] / max(b['p99_ms'], 1e-3):.2f}x",
        )
    console.print(table)
    sizes = Table(title="sizes after the fill")
    for column in ("table", "rows", "table", "indexes", "total"):
        sizes.add_column(column, justify="left" if column == "table" else "right")
    for name in TABLES:
        s = report["sizes_after"][name]
        sizes.add_row(
            name,
            f"{s['rows']:,}",
            _size(s.get("table_bytes", 0)),
            _size(s.get("index_bytes", 0)),
            _size(s.get("total_bytes", 0)),
        )
    console.print(sizes)
    console.print(
        f"load average {report['load_average_start']} at the start, "
        f"{report['load_average_end']} at the end; see docs/benchmarks.md."
    )


@click.command("bench")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option(
    "--db",
    default=None,
    help="sqlite:///file.db or postgresql://... (default: a temp SQLite file in the "
    "current directory, i.e. on the same disk as the default database).",
)
@click.option("--quick", is_flag=True, help="Small sizes: a smoke test of a few seconds.")
@click.option(
    "--api", is_flag=True,
    help="Benchmark the HTTP service instead (JSON): POST /v1/runs closed loop (saturation "
    "runs/s, p50/p99) and at a fixed rate (--rate), each without and with Idempotency-Key; "
    "SSE lag.",
)  # fmt: skip
@click.option(
    "--rate", default=1000.0, show_default=True, type=click.FloatRange(0),
    help="With --api: offer POST /v1/runs at this many requests/s (open loop; latency from "
    "each request's scheduled send time). 0 skips the fixed-rate phases.",
)  # fmt: skip
@click.option(
    "--rate-seconds", default=None, type=click.FloatRange(0.1),
    help="With --api: length of each fixed-rate phase [default: 5, 1 with --quick].",
)  # fmt: skip
@click.option(
    "--growth", default=None, type=click.IntRange(1), metavar="STEPS",
    help="Benchmark the store under growth instead: the claim, stuck-run, metrics, journal "
    "and runs-list queries before and after filling a new database with STEPS finished "
    "steps (PostgreSQL: created on --db's server and dropped at the end).",
)  # fmt: skip
@click.option(
    "--rounds", default=200, show_default=True, type=click.IntRange(1),
    help="With --growth: timed rounds per phase.",
)  # fmt: skip
@click.option(
    "--keep", is_flag=True, help="With --growth: keep the filled database (its URL is printed)."
)
def bench(
    as_json: bool,
    db: str | None,
    quick: bool,
    api: bool,
    rate: float,
    rate_seconds: float | None,
    growth: int | None = None,
    rounds: int = 200,
    keep: bool = False,
) -> None:
    """Measure per-step overhead against raw INSERT+COMMIT, throughput and bytes stored.

    With --api, the HTTP service instead: one `serve` subprocess on loopback, loaded
    from this process. Closed loop (32 clients back to back) gives the saturation
    throughput; the fixed-rate phases give the latency at --rate requests/s, which is
    what a p99 target is about. Prints one JSON object.
    """
    if growth is not None:
        from agentledger_bench.growth import run_growth

        err = Console(stderr=True)
        report = asyncio.run(
            run_growth(db, growth, rounds, keep, lambda msg: err.print(f"[dim]{msg}[/dim]"))
        )
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            render_growth(report, Console())
        return
    if api:
        from agentledger_bench.api import run_api_bench

        sizes: dict[str, Any] = {"requests": 300, "streams": 20} if quick else {}
        sizes["rate"] = rate
        sizes["rate_seconds"] = rate_seconds or (1.0 if quick else 5.0)
        click.echo(json.dumps(asyncio.run(run_api_bench(db, **sizes)), indent=2))
        return
    from agentledger_bench import BenchConfig, run_bench

    console = Console(stderr=True)
    config = BenchConfig.make(db=db, quick=quick)
    progress = None if as_json else (lambda msg: console.print(f"[dim]{msg}[/dim]"))
    report = asyncio.run(run_bench(config, progress))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        render(report, Console())
