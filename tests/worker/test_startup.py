"""Several workers started at once on a fresh database all come up and stay up.

Each migrates on open; the first takes the database's exclusive lock and makes the
schema, the others wait for it (past their busy timeout, too) and find it made.
Real worker processes, released by one gate so that they open the database at the
same moment, on SQLite (a busy timeout of 1 ms makes every wait outlast it) and on
PostgreSQL (an empty database).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentledger.records import RunStatus
from tests import dbutil
from tests.engine.helpers import APP, ROOT, Env, wait_for

WORKERS = 6


@pytest.fixture
def fresh_env(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """An engine world whose database has no schema yet."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:
        request.getfixturevalue("_pg_session")
        url = dbutil.make_pg_database(migrated=False)
    world = Env(tmp_path, url)
    try:
        yield world
    finally:
        world.close()
        if backend != "sqlite":
            dbutil.drop_pg_database(url)


def _worker_url(env: Env) -> str:
    # SQLite: a busy timeout far below the first migration's time, so that the race
    # it loses is met every time (the test's own store keeps the default).
    return f"{env.url}?busy_timeout_ms=1" if env.url.startswith("sqlite") else env.url


def _start_gated(env: Env, gate: Path, n: int) -> subprocess.Popen[bytes]:
    child = env.child_env()
    child["GATE"] = str(gate)
    log = open(env.tmp / f"worker{n}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.worker.gated_worker", "worker", "--app", APP,
         "--db", _worker_url(env), "--poll-seconds", "0.05", "--lease-seconds", "2"],
        cwd=ROOT, env=child, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    env.workers.append(proc)
    return proc


def _up(env: Env, procs: list[subprocess.Popen[bytes]]) -> bool:
    for n, proc in enumerate(procs, start=1):
        assert proc.poll() is None, f"worker {n} exited at startup:\n{env.worker_log(n)}"
    return all(" started:" in env.worker_log(n) for n in range(1, len(procs) + 1))


def test_workers_started_at_once_on_a_fresh_database_all_come_up(fresh_env: Env) -> None:
    env = fresh_env
    gate = env.tmp / "gate"
    procs = [_start_gated(env, gate, n) for n in range(1, WORKERS + 1)]
    wait_for(
        lambda: all((env.tmp / f"gate.{p.pid}.ready").exists() for p in procs) or _up(env, procs),
        timeout=60,
        what="every worker waiting at the gate",
    )
    gate.touch()
    wait_for(lambda: _up(env, procs), timeout=60, what="every worker to start")
    # And they stay up: every one of them is working (runs complete) and alive after.
    with env.one_store():  # the test's own writes and reads: one store, not one each
        ids = [env.submit("quick", {"n": n}) for n in range(3 * WORKERS)]
        for run_id in ids:
            env.wait_status(run_id, RunStatus.COMPLETED, timeout=60)
    assert _up(env, procs)
    live = wait_for(
        lambda: (
            {w.pid for w in env._store(lambda s: s.list_workers(live_within=60))}
            >= {p.pid for p in procs}
        ),
        what="every worker registered and heartbeating",
    )
    assert live
