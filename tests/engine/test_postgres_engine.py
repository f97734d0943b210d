"""The engine on a real PostgreSQL server: restarts and connection limits."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env, tool_steps, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def pg_env(pg_url: str, tmp_path: Path) -> Iterator[Env]:
    world = Env(tmp_path, pg_url)
    try:
        yield world
    finally:
        world.close()


def _restart_postgres() -> None:
    if shutil.which("pg_ctlcluster") is None or not os.path.isdir("/etc/postgresql"):
        if os.environ.get("CI"):
            pytest.fail("pg_ctlcluster is needed to restart PostgreSQL in CI")
        pytest.skip("cannot restart the local PostgreSQL here (no pg_ctlcluster)")
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )


def test_postgres_restart_mid_runs_loses_nothing_and_effects_stay_once(pg_env: Env) -> None:
    ids = [pg_env.submit("slow_writes", {"tag": f"r{n}", "n": 4, "pause": 0.3}) for n in range(6)]
    pg_env.start_worker(lease=3.0)
    pg_env.start_worker(lease=3.0)
    wait_for(lambda: all(pg_env.run(i).step_count >= 1 for i in ids), what="all runs started")
    _restart_postgres()
    for run_id in ids:
        pg_env.wait_status(run_id, RunStatus.COMPLETED, timeout=120)
    keys = [s.idempotency_key for i in ids for s in tool_steps(pg_env.journal(i), "keyed_write")]
    assert len(keys) == 24
    assert pg_env.effects("keyed") == dict.fromkeys(keys, 1)
    for run_id in ids:
        run = pg_env.run(run_id)
        assert run.lease_owner is None, run
        journal = pg_env.journal(run_id)
        assert len({s.step_no for s in journal}) == len(journal) == 8


def test_concurrency_far_above_connections_does_not_deadlock(pg_env: Env) -> None:
    # One worker holds one writer connection and one listener, whatever its concurrency.
    ids = [pg_env.submit("quick", {"n": n}) for n in range(60)]
    pg_env.start_worker(concurrency=60)
    for run_id in ids:
        pg_env.wait_status(run_id, RunStatus.COMPLETED, timeout=90)
    assert len(pg_env.effects("keyed")) == 60
    assert set(pg_env.effects("keyed").values()) == {1}
