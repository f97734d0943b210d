"""``python -m agentledger_anchors``: agentledger, DBOS Transact and LangGraph, one run.

Rounds are interleaved (agentledger, DBOS, LangGraph, agentledger, ...), each
measurement in a fresh process on a fresh database (a SQLite file in a temp directory
under ``--workdir``, or a database created on the ``--db`` server and dropped after).
Prints one table of figures per store with agentledger's advantage over the best
anchor, and a table of every configuration measured; ``--json`` keeps every sample.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentledger_anchors import resume

SYSTEMS = {"agentledger": "agentledger", "dbos": "DBOS Transact", "langgraph": "LangGraph"}
# Every configuration measured; a system's figure is its best one (named in the table).
VARIANTS = {
    "agentledger": {"sqlite": ["default"], "postgresql": ["default"]},
    "dbos": {"sqlite": ["default", "wal"], "postgresql": ["default"]},
    "langgraph": {
        "sqlite": ["functional", "graph", "functional-async"],
        "postgresql": ["functional", "graph", "functional-async"],
    },
}
RESUME_VARIANT = {"dbos": "default", "langgraph": "functional"}
CANNOT_STANDBY = {
    "dbos": "cannot: a running process does not recover another's workflows (DBOS "
    "Conductor does, or a restart with the same executor id)",
    "langgraph": "cannot: no worker or lease; the application must find the thread "
    "and invoke it again",
}
PACKAGES = (
    "agentledger",
    "dbos",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "psycopg",
    "SQLAlchemy",
    "aiosqlite",
)


def say(message: str) -> None:
    print(f"[anchors {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


# fresh stores ------------------------------------------------------------------------


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@contextmanager
def fresh_store(store: str, args: argparse.Namespace) -> Iterator[tuple[Path, str]]:
    """(a temp directory, the target: a SQLite file in it or a fresh PostgreSQL URL)."""
    workdir = Path(tempfile.mkdtemp(prefix=".anchors-", dir=args.workdir))
    name = ""
    try:
        if store == "sqlite":
            yield workdir, str(workdir / "store.db")
        else:
            import psycopg

            name = f"anchors_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(args.db, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            yield workdir, _with_db(args.db, name)
    finally:
        if name:
            import psycopg

            with psycopg.connect(args.db, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(workdir, ignore_errors=True)


def child(system: str, job: str, payload: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "agentledger_anchors.child", system, job, json.dumps(payload)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"{system} {job} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


# measurements ------------------------------------------------------------------------


def steps_round(system: str, variant: str, store: str, args: argparse.Namespace) -> dict[str, Any]:
    with fresh_store(store, args) as (workdir, target):
        if system == "agentledger":
            report = child(
                system,
                "steps",
                {
                    "db": None if store == "sqlite" else target,
                    "workdir": str(workdir),
                    "quick": args.quick,
                },
            )
            return {
                "config": "agentledger bench (its own process, the store's defaults)",
                "raw_us": report["raw_commit_us"],
                "read_ratio": report["read_step_ratio"],
                "write_ratio": report["write_step_ratio"],
                "concurrent": report["concurrent_steps_per_s"],
                "concurrent_mode": "asyncio, one worker",
                "bytes_per_step": report["bytes_per_step_500"],
                "growth": report["bytes_growth_500_over_100"],
                "report": report,
            }
        raw_target = str(workdir / "raw.db") if store == "sqlite" else target
        out = child(
            system,
            "steps",
            {
                "store": store,
                "target": target,
                "raw_target": raw_target,
                "variant": variant,
                "reps": args.reps,
                "steps": args.steps,
                "runs": args.runs,
                "run_steps": args.run_steps,
                "concurrent_reps": args.concurrent_reps,
            },
        )
    samples = out["samples_us"]
    raw = statistics.median(samples["raw"])
    modes = {
        mode: statistics.median(rates) for mode, rates in out["concurrent_steps_per_s"].items()
    }
    best_mode = max(modes, key=lambda m: modes[m])
    return {
        "config": out["config"],
        "raw_us": raw,
        "read_ratio": statistics.median(samples["read"]) / raw,
        "write_ratio": statistics.median(samples["write"]) / raw,
        "concurrent": modes[best_mode],
        "concurrent_mode": best_mode,
        "concurrent_by_mode": modes,
        "samples": out,
    }


def bytes_of(system: str, variant: str, store: str, args: argparse.Namespace) -> dict[str, Any]:
    grown = {}
    for n in (args.mid, args.large):
        with fresh_store(store, args) as (_workdir, target):
            out = child(
                system,
                "bytes",
                {"store": store, "target": target, "variant": variant, "n": n, "payload": 500},
            )
            grown[n] = out["growth"]
    return {
        "bytes_per_step": grown[args.large] / args.large,
        "growth": grown[args.large] / max(grown[args.mid], 1),
    }


async def resume_round(system: str, store: str, case: str, args: argparse.Namespace) -> Any:
    if system != "agentledger" and case == "standby":
        return CANNOT_STANDBY[system]
    with fresh_store(store, args) as (workdir, target):
        if system == "agentledger":
            url = f"sqlite:///{target}" if store == "sqlite" else target
            return await resume.agentledger_round(url, workdir, case)
        return await resume.other_round(system, store, target, RESUME_VARIANT[system], workdir)


# the report --------------------------------------------------------------------------


def attempt(measure: Any, *args: Any) -> Any:
    """One measurement; a failure is recorded (and shown) instead of ending the session."""
    try:
        return measure(*args)
    except Exception as exc:
        say(f"failed: {exc!r}"[:2000])
        return {"error": repr(exc)[:2000]}


def summarise(per_variant: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Medians over rounds per configuration."""
    out = {}
    for variant, measured in per_variant.items():
        rounds = [r for r in measured if "error" not in r]
        if not rounds:
            continue
        out[variant] = {
            "config": rounds[0]["config"],
            "raw_us": median([r["raw_us"] for r in rounds]),
            "read_ratio": median([r["read_ratio"] for r in rounds]),
            "write_ratio": median([r["write_ratio"] for r in rounds]),
            "concurrent": median([r["concurrent"] for r in rounds]),
            "concurrent_mode": rounds[0]["concurrent_mode"],
        }
    return out


def best(summary: dict[str, dict[str, Any]], key: str, higher: bool) -> tuple[float | None, str]:
    found = [(v[key], name) for name, v in summary.items() if v.get(key) is not None]
    if not found:
        return None, ""
    value, name = (max if higher else min)(found)
    return value, name


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}{unit}"
    if abs(value) >= 10:
        return f"{value:,.1f}{unit}"
    return f"{value:,.2f}{unit}"


def resume_cell(measured: list[Any]) -> tuple[str, float | None]:
    samples = [s for s in measured if not (isinstance(s, dict) and "error" in s)]
    if samples and isinstance(samples[0], str):
        return samples[0], None
    seconds = [s["seconds"] for s in samples]
    again = [s["reexecuted"] for s in samples]
    if not seconds:
        return "-", None
    text = (
        f"{fmt(median(seconds), ' s')} (max {fmt(max(seconds), ' s')}); "
        f"re-ran {fmt(median(again))} (max {max(again)})"
    )
    return text, median(seconds)


def store_table(store: str, data: dict[str, Any]) -> list[str]:
    names = list(data["steps"])
    summaries = {s: summarise(data["steps"][s]) for s in names}
    for system, per_variant in data["bytes"].items():
        for variant, figures in per_variant.items():
            if "error" not in figures:
                summaries[system].setdefault(variant, {"config": variant}).update(figures)
    if "agentledger" in summaries:
        for variant, measured in data["steps"]["agentledger"].items():
            rounds = [r for r in measured if "error" not in r]
            if variant in summaries["agentledger"]:
                summaries["agentledger"][variant]["bytes_per_step"] = median(
                    [r["bytes_per_step"] for r in rounds]
                )
                summaries["agentledger"][variant]["growth"] = median([r["growth"] for r in rounds])
    header = ["figure", *(SYSTEMS[s] for s in names), "agentledger's advantage over the best"]
    lines = [
        f"**{store}**",
        "",
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
    ]
    rows = [
        ("raw fsynced INSERT+COMMIT, µs (the store's limit)", "raw_us", False),
        ("read step / raw commit", "read_ratio", False),
        ("write step / raw commit", "write_ratio", False),
        (
            f"{data['sizes']['runs']} runs x {data['sizes']['run_steps']} steps, steps/s",
            "concurrent",
            True,
        ),
        ("stored bytes per 500-B step, 500-step run", "bytes_per_step", False),
        ("growth 500 / 100 steps (linear: 5)", "growth", False),
    ]
    for label, key, higher in rows:
        cells, values = [], {}
        for system in names:
            value, variant = best(summaries[system], key, higher)
            if key == "raw_us":  # the store's, not a system's: every measurement of it
                value = median([s["raw_us"] for s in summaries[system].values() if "raw_us" in s])
                variant = ""
            values[system] = value
            tag = f" ({variant})" if len(summaries[system]) > 1 and variant else ""
            cells.append(fmt(value) + tag)
        advantage = ""
        anchors = [v for s, v in values.items() if s != "agentledger" and v is not None]
        mine = values.get("agentledger")
        if anchors and mine and key != "raw_us":
            top = max(anchors) if higher else min(anchors)
            advantage = f"{(mine / top) if higher else (top / mine):.2f}x"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {advantage} |")
    for case, label in (
        ("standby", "kill -9 -> first resumed step, by a running standby process"),
        ("restart", "kill -9 -> first resumed step, by a process started after the kill"),
    ):
        cells, times = [], {}
        for system in names:
            text, seconds = resume_cell(data["resume"].get(system, {}).get(case, []))
            cells.append(text)
            times[system] = seconds
        anchors = [v for s, v in times.items() if s != "agentledger" and v is not None]
        mine = times.get("agentledger")
        advantage = f"{min(anchors) / mine:.2f}x" if anchors and mine else ""
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {advantage} |")
    lines += ["", "Configurations (medians over the rounds):", ""]
    lines += [
        "| system | configuration | raw µs | read / raw | write / raw | steps/s (mode) "
        "| B per step | growth |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for system in names:
        for variant, s in summaries[system].items():
            lines.append(
                f"| {SYSTEMS[system]} | {variant}: {s.get('config', '')} | {fmt(s.get('raw_us'))} "
                f"| {fmt(s.get('read_ratio'))} | {fmt(s.get('write_ratio'))} "
                f"| {fmt(s.get('concurrent'))} ({s.get('concurrent_mode', '')}) "
                f"| {fmt(s.get('bytes_per_step'))} | {fmt(s.get('growth'))} |"
            )
    return lines


NOTES = [
    "Each system's figure is its best configuration (named in brackets; all of them in "
    "the second table). Advantage: how many times better agentledger's figure is than "
    "the best anchor's (below 1: worse).",
    "Write step: agentledger commits twice (the intent before the call, the outcome "
    "after); DBOS and LangGraph commit once, after the call, so a write in flight at a "
    "crash runs again with no record that it may have happened.",
    "LangGraph's Functional API hands a task's result to a background thread to save, "
    'also with durability="sync" (only checkpoints are waited for): its step times do '
    "not wait for the commit.",
    "Restart: from the kill to the first step of a new process, its start included.",
]


def versions(args: argparse.Namespace) -> list[str]:
    found = []
    for package in PACKAGES:
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    machine = (
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}"
    )
    if args.db:
        import psycopg

        with psycopg.connect(args.db, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            machine += f", PostgreSQL {row[0] if row else '?'}"
    return [", ".join(found), machine]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--db",
        help="postgresql://user@host:5432/postgres: also on that server (databases "
        "are created and dropped there)",
    )
    parser.add_argument(
        "--stores", default=None, help="sqlite,postgresql (default: both with --db)"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="which systems")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per store")
    parser.add_argument("--kills", type=int, default=5, help="kills per system, store and case")
    parser.add_argument(
        "--skip",
        default="",
        help="configurations not to measure: system:variant[@store], comma-separated "
        "(e.g. dbos:default@sqlite,langgraph:functional-async)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--workdir", default=os.getcwd(), help="where SQLite files go")
    parser.add_argument("--json", dest="json_out", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    # agentledger's bench sizes; the concurrent runs once per round (the rounds repeat it)
    args.reps, args.steps, args.runs, args.run_steps, args.concurrent_reps = 5, 200, 200, 10, 1
    args.mid, args.large = 100, 500
    if args.quick:
        args.reps, args.steps, args.runs, args.run_steps, args.concurrent_reps = 2, 30, 20, 5, 1
        args.rounds, args.kills = min(args.rounds, 1), min(args.kills, 1)
    stores = (
        args.stores.split(",") if args.stores else ["sqlite"] + (["postgresql"] if args.db else [])
    )
    systems = args.systems.split(",")
    for skipped in filter(None, args.skip.split(",")):
        system, _, rest = skipped.partition(":")
        variant, _, only = rest.partition("@")
        for store_name, per_store in VARIANTS[system].items():
            if variant in per_store and only in ("", store_name):
                per_store.remove(variant)
    started = time.time()
    load = [os.getloadavg()[0]]
    results: dict[str, Any] = {}
    for store in stores:
        data: dict[str, Any] = {
            "steps": {s: {v: [] for v in VARIANTS[s][store]} for s in systems},
            "bytes": {},
            "resume": {s: {"standby": [], "restart": []} for s in systems},
            "sizes": {"runs": args.runs, "run_steps": args.run_steps, "steps": args.steps},
        }
        results[store] = data
        for round_no in range(args.rounds):
            for system in systems:
                for variant in VARIANTS[system][store]:
                    say(f"{store} round {round_no + 1}/{args.rounds}: {system} {variant}")
                    data["steps"][system][variant].append(
                        attempt(steps_round, system, variant, store, args)
                    )
                    load.append(os.getloadavg()[0])
        for system in systems:
            if system == "agentledger":
                continue  # its own bench measured it above, the same way
            data["bytes"][system] = {}
            for variant in VARIANTS[system][store]:
                say(f"{store} bytes: {system} {variant}")
                data["bytes"][system][variant] = attempt(bytes_of, system, variant, store, args)
        for kill in range(args.kills):
            for system in systems:
                for case in ("standby", "restart"):
                    say(f"{store} kill {kill + 1}/{args.kills}: {system} {case}")
                    data["resume"][system][case].append(
                        attempt(lambda *a: asyncio.run(resume_round(*a)), system, store, case, args)
                    )
            load.append(os.getloadavg()[0])
        if args.json_out:  # each store as soon as it is done
            args.json_out.write_text(json.dumps(results, indent=2, default=str))
    lines = [
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))} UTC, "
        f"{(time.time() - started) / 60:.0f} min; load average "
        f"{min(load):.1f} to {max(load):.1f}; {args.rounds} rounds, {args.kills} kills per case",
        *versions(args),
        "",
    ]
    for store, data in results.items():
        lines += store_table(store, data)
        lines.append("")
    lines += [f"* {note}" for note in NOTES]
    print("\n".join(lines))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
