#!/usr/bin/env python3
"""Compare ``agentledger bench --json`` of a git ref with the working tree, side by side.

    python bench/compare.py REF [--rounds 3] [--db postgresql://user@host/any]

REF is checked out into a git worktree in a temp dir and installed, with its own
``pyproject.toml`` (so an old commit gets the dependencies it declared), into a venv
cached per commit under ``--cache`` (a rerun skips the install). The working tree
(tracked and untracked, not ignored, files, i.e. uncommitted edits too) is copied and
installed into a venv of its own whose dependencies are cached by the hash of its
``pyproject.toml`` files. Both are run from their installs, never from ``PYTHONPATH``.

The two are then run interleaved, REF, HEAD, REF, HEAD, ..., ``--rounds`` times, on
SQLite (a temp directory in ``--workdir``, the same disk as the default database) and,
with ``--db postgresql://...``, on PostgreSQL (a fresh database on that server per run,
dropped afterwards). The table shows the median of each figure per side and HEAD / REF.

Stdlib only: it runs under any Python 3.11+ and does not import the package it measures.
Timings are noisy on a shared machine: read the ratios of medians, not one run.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "agentledger-compare"
# The packages under bench/ that a tree may ship besides the runtime; this tool's own
# optional installs are not part of what is measured.
_NOT_MEASURED = {"anchors"}

# (JSON path, label, which way is better). Missing figures (an older REF) print as "-".
FIGURES: list[tuple[str, str, str]] = [
    ("raw_commit_us", "(a) raw INSERT+COMMIT, µs (the disk, not the code)", ""),
    ("read_step_us", "(b) read tool step, µs", "lower"),
    ("read_step_ratio", "(b) read step / raw commit", "lower"),
    ("read_step_ratio_paired_median", "(b) read step / raw, paired", "lower"),
    ("ctx_step_ratio", "(b') ctx.step / raw commit", "lower"),
    ("write_step_us", "(c) write tool step, µs", "lower"),
    ("write_step_ratio", "(c) write step / raw commit", "lower"),
    ("write_step_ratio_paired_median", "(c) write step / raw, paired", "lower"),
    ("concurrent_steps_per_s", "(d) 200 runs x 10 steps, steps/s", "higher"),
    ("raw_commits_per_s", "(d) raw commits/s beside it", ""),
    ("concurrent_over_raw_commits", "(d) steps/s / raw commits/s", "higher"),
    ("group_sizes.median", "(d) group commit batch, median", ""),
    ("bytes_per_step_500", "(e) stored bytes per 500-B step", "lower"),
    ("stored_bytes_over_payload", "(e) stored bytes / payload", "lower"),
    ("bytes_growth_500_over_100", "(e) growth 500 / 100 steps", "lower"),
    ("process_throughput_steps_per_s.1", "1 worker process, steps/s", "higher"),
    ("process_throughput_steps_per_s.2", "2 worker processes, steps/s", "higher"),
    ("process_throughput_steps_per_s.4", "4 worker processes, steps/s", "higher"),
    ("resume.same_host.median_s", "kill -> resumed step, same host, s", "lower"),
    ("resume.other_host.median_s", "kill -> resumed step, lease expiry, s", "lower"),
]

# Runs agentledger's bench with a different number of kills: the package is looked up
# at run time, so a tree whose bench moved still works if it keeps these two names.
_DRIVER = r"""
import asyncio, dataclasses, importlib, json, sys
names = sys.argv[3].split(",")
for name in names:
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    if hasattr(module, "run_bench") and hasattr(module, "BenchConfig"):
        break
else:
    sys.exit(f"no bench package with run_bench and BenchConfig among {names}")
config = module.BenchConfig.make(db=sys.argv[1] or None, quick=False)
config = dataclasses.replace(config, kills=int(sys.argv[2]))
print(json.dumps(asyncio.run(module.run_bench(config, None))))
"""
_BENCH_MODULES = "agentledger.bench,agentledger_bench,agentledger_bench.runner"


def say(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kwargs)


def git(*args: str) -> str:
    return run(["git", "-C", str(REPO), *args], capture_output=True).stdout.strip()


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """The environment of a child: nothing that would make it import another tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise two compares building the same venv."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _extras(project: Path) -> set[str]:
    try:
        with open(project, "rb") as handle:
            return set(tomllib.load(handle).get("project", {}).get("optional-dependencies", {}))
    except FileNotFoundError:
        return set()


def bench_projects(tree: Path) -> list[Path]:
    """The bench packages a tree ships besides the runtime (``bench/`` itself or folders
    under it); this tool's own optional installs are not part of what is measured."""
    bench = tree / "bench"
    found = [bench] if (bench / "pyproject.toml").is_file() else []
    found += [
        project.parent
        for project in sorted(bench.glob("*/pyproject.toml"))
        if project.parent.name not in _NOT_MEASURED
    ]
    return found


def install_targets(tree: Path) -> list[str]:
    """The runtime with its PostgreSQL driver, plus any bench package the tree ships.

    psycopg's own build of libpq where the tree offers it (``postgres-binary``), so that
    an old tree (whose ``postgres`` extra was the binary build) and a new one use the
    same driver.
    """
    driver = (
        "postgres-binary" if "postgres-binary" in _extras(tree / "pyproject.toml") else "postgres"
    )
    targets = [f"{tree}[{driver}]"]
    for project in bench_projects(tree):
        postgres = "postgres" in _extras(project / "pyproject.toml")
        targets.append(f"{project}[postgres]" if postgres else str(project))
    return targets


def make_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], env=clean_env())
    return python


def pip_install(python: Path, args: list[str]) -> None:
    run([str(python), "-m", "pip", "install", "-q", *args], env=clean_env())


def ref_venv(sha: str, cache: Path) -> Path:
    """A venv with REF installed from its own tree; built once per commit."""
    venv = cache / f"venv-{sha[:12]}"
    marker = venv / ".compare-installed"
    with locked(cache / f"venv-{sha[:12]}.lock"):
        if marker.exists():
            say(f"REF {sha[:12]}: cached venv {venv}")
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix="agentledger-compare-"))
        tree = scratch / "tree"
        try:
            say(f"REF {sha[:12]}: worktree in {tree}, venv {venv}")
            git("worktree", "add", "--detach", str(tree), sha)
            python = make_venv(venv)
            pip_install(python, install_targets(tree))
            marker.write_text(sha + "\n")
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                git("worktree", "remove", "--force", str(tree))
            shutil.rmtree(scratch, ignore_errors=True)
    return venv


def copy_working_tree(dest: Path) -> None:
    """Tracked files and untracked ones not ignored, as they are on disk now."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for name in sorted(set(filter(None, listed.split("\0")))):
        source = REPO / name
        if not source.is_file():
            continue  # deleted but not yet committed
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def head_venv(cache: Path) -> Path:
    """A venv with the working tree installed; its dependencies cached by pyproject."""
    digest = hashlib.sha256(sys.version.encode())
    for project in [REPO, *bench_projects(REPO)]:
        digest.update((project / "pyproject.toml").read_bytes())
    key = digest.hexdigest()[:12]
    venv = cache / f"venv-worktree-{key}"
    with locked(cache / f"venv-worktree-{key}.lock"):
        scratch = Path(tempfile.mkdtemp(prefix="agentledger-compare-"))
        try:
            tree = scratch / "tree"
            copy_working_tree(tree)
            python = make_venv(venv)
            marker = venv / ".compare-deps"
            if not marker.exists():
                say(f"HEAD: dependencies into {venv}")
                pip_install(python, install_targets(tree))
                marker.write_text(key + "\n")
            say("HEAD: installing the working tree")
            pip_install(python, ["--no-deps", "--force-reinstall", *install_targets(tree)])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return venv


# PostgreSQL: a fresh database per run ------------------------------------------------


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


_PG_ADMIN = r"""
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    if sys.argv[2] == "create":
        conn.execute(f'CREATE DATABASE "{sys.argv[3]}"')
    else:
        conn.execute(f'DROP DATABASE IF EXISTS "{sys.argv[3]}" WITH (FORCE)')
"""


def pg_admin(python: Path, url: str, action: str, name: str) -> None:
    run([str(python), "-c", _PG_ADMIN, _with_db(url, "postgres"), action, name], env=clean_env())


# one benchmark run -------------------------------------------------------------------


def bench_command(venv: Path, db: str | None, kills: int | None) -> list[str]:
    python = venv / "bin" / "python"
    if kills is not None:
        return [str(python), "-c", _DRIVER, db or "", str(kills), _BENCH_MODULES]
    script = venv / "bin" / "agentledger"
    command = [str(script), "bench", "--json"]
    return [*command, "--db", db] if db else command


def parse_report(stdout: str) -> dict[str, Any]:
    start = stdout.find("{")
    if start < 0:
        raise RuntimeError(f"no JSON in the bench output: {stdout[-500:]!r}")
    report: dict[str, Any] = json.loads(stdout[start:])
    return report


def bench_once(
    label: str, venv: Path, backend: str, args: argparse.Namespace, admin_python: Path
) -> dict[str, Any]:
    db = None
    name = ""
    if backend == "postgresql":
        name = f"agentledger_compare_{uuid.uuid4().hex[:10]}"
        pg_admin(admin_python, args.db, "create", name)
        db = _with_db(args.db, name)
    say(f"{backend}: {label}")
    started = time.perf_counter()
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(
            bench_command(venv, db, args.kills),
            cwd=args.workdir,
            env=clean_env(venv),
            capture_output=True,
            text=True,
        )
    finally:
        if name:
            pg_admin(admin_python, args.db, "drop", name)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} bench failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = parse_report(proc.stdout)
    report["_compare"] = {
        "seconds": round(time.perf_counter() - started, 1),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
    return report


# the table ---------------------------------------------------------------------------


def lookup(report: dict[str, Any], path: str) -> float | None:
    value: Any = report
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return float(value) if isinstance(value, int | float) else None


def median_of(reports: list[dict[str, Any]], path: str) -> float | None:
    values = [v for v in (lookup(r, path) for r in reports) if v is not None]
    return float(statistics.median(values)) if values else None


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:,.3f}"


def table(results: dict[str, dict[str, list[dict[str, Any]]]], ref_label: str) -> str:
    lines = [
        f"| figure | {ref_label} | HEAD | HEAD / {ref_label} | |",
        "| --- | --- | --- | --- | --- |",
    ]
    for backend, sides in results.items():
        lines.append(f"| **{backend}** | | | | |")
        for path, label, better in FIGURES:
            old, new = median_of(sides["ref"], path), median_of(sides["head"], path)
            if old is None and new is None:
                continue
            ratio = new / old if old and new is not None else None
            verdict = ""
            if ratio is not None and better and abs(ratio - 1) > 0.05:
                improved = ratio < 1 if better == "lower" else ratio > 1
                verdict = "better" if improved else "worse"
            lines.append(
                f"| {label} | {fmt(old)} | {fmt(new)} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} | {verdict} |"
            )
    return "\n".join(lines)


def describe(results: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace) -> str:
    any_report = next(r for sides in results.values() for r in sides["head"])
    machine = any_report.get("machine", {})
    lines = [
        f"REF {args.ref} = {args.sha[:12]} ({git('log', '-1', '--format=%s', args.sha)[:72]})",
        f"HEAD = {args.head_label}",
        f"{args.rounds} rounds, interleaved REF, HEAD, ...; medians of the rounds"
        + (f"; kills per resume case: {args.kills}" if args.kills is not None else ""),
        f"machine: {machine.get('cpus')} CPUs, {machine.get('platform')}, Python "
        f"{machine.get('python')}, SQLite {machine.get('sqlite')}",
    ]
    for backend, sides in results.items():
        for side, reports in sides.items():
            meta = [r["_compare"] for r in reports]
            loads = [m["load_before"] for m in meta] + [m["load_after"] for m in meta]
            pg = reports[0].get("postgres", {}).get("server_version") if reports else None
            lines.append(
                f"{backend} {side}: {len(reports)} runs, "
                f"{statistics.median(m['seconds'] for m in meta):.0f} s each, "
                f"load average {min(loads):.1f} to {max(loads):.1f}"
                + (f", PostgreSQL {pg}" if pg else "")
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ref", help="the git ref to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=3, help="REF, HEAD pairs per backend")
    parser.add_argument(
        "--db",
        default=None,
        help="postgresql://user@host/any: also compare on that server (a fresh "
        "database per run, created and dropped)",
    )
    parser.add_argument(
        "--backends",
        default=None,
        help="comma-separated subset of sqlite,postgresql (default: sqlite, plus "
        "postgresql with --db)",
    )
    parser.add_argument(
        "--kills",
        type=int,
        default=None,
        help="kill -> resume rounds per case (default: the bench's own; 0 skips them)",
    )
    parser.add_argument(
        "--workdir",
        default=os.getcwd(),
        help="where SQLite runs put their temp directory (default: the current "
        "directory; keep it on the disk you care about, not a tmpfs)",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="venv cache")
    parser.add_argument("--json", dest="json_out", type=Path, help="write every report here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1 (got {args.rounds})")

    args.sha = git("rev-parse", "--verify", f"{args.ref}^{{commit}}")
    head = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    args.head_label = f"{head[:12]}{' + uncommitted changes' if dirty else ''}"
    backends = (
        args.backends.split(",")
        if args.backends
        else ["sqlite"] + (["postgresql"] if args.db else [])
    )
    if "postgresql" in backends and not (args.db or "").startswith(("postgresql:", "postgres:")):
        parser.error("postgresql needs --db postgresql://...")

    old = ref_venv(args.sha, args.cache)
    new = head_venv(args.cache)
    admin = new / "bin" / "python"
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        b: {"ref": [], "head": []} for b in backends
    }
    for round_no in range(args.rounds):
        for backend in backends:
            say(f"round {round_no + 1}/{args.rounds}, {backend}")
            results[backend]["ref"].append(bench_once("REF", old, backend, args, admin))
            results[backend]["head"].append(bench_once("HEAD", new, backend, args, admin))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))
    print(describe(results, args))
    print()
    print(table(results, args.ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
