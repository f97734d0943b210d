"""A SIGTERM that reaches a worker while it starts ends it cleanly: exit 0, one log line.

Real worker processes, signalled at a point they are known to have reached: inside a
slow app import (the app module says so with a file), and inside the schema migration's
wait for a SQLite lock this test holds (the worker logs that it waits).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.engine.helpers import ROOT, Env, wait_for
from tests.worker.procs import wait_log


def _start(env: Env, app: str, db: str, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
    env._logs += 1
    log = open(env.tmp / f"worker{env._logs}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentledger.cli._main", "worker", "--app", app, "--db", db],
        cwd=ROOT, env={**env.child_env(), **extra_env}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    env.workers.append(proc)
    return proc


def test_sigterm_during_a_slow_app_import_exits_0(tmp_path: Path) -> None:
    env = Env(tmp_path)
    try:
        flag = tmp_path / "import.flag"
        flag.write_text("hold")
        proc = _start(
            env, "tests.worker.slow_import_app:app", env.url, {"SLOW_IMPORT_FLAG": str(flag)}
        )
        wait_for(Path(str(flag) + ".importing").exists, 60, "the worker to import the app")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, env.worker_log(1)
        assert "SIGTERM while starting" in env.worker_log(1)
    finally:
        env.close()


def test_sigterm_during_the_migration_wait_exits_0(tmp_path: Path) -> None:
    env = Env(tmp_path)
    fresh = tmp_path / "fresh.db"
    lock = sqlite3.connect(fresh, isolation_level=None)
    try:
        lock.execute("PRAGMA journal_mode = WAL")
        lock.execute("BEGIN IMMEDIATE")  # the worker's migration waits for this write lock
        proc = _start(env, "tests.apps.engine_app:app", f"sqlite:///{fresh}?busy_timeout_ms=1", {})
        wait_log(env, 1, "the database is locked by another process", timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, env.worker_log(1)
        assert "SIGTERM while starting" in env.worker_log(1)
    finally:
        lock.close()
        env.close()
