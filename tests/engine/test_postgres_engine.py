"""The engine on a real PostgreSQL server: restarts (of a private cluster) and
connection limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env, tool_steps
from tests.pgcluster import PrivateCluster

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_postgres_restart_mid_runs_loses_nothing_and_effects_stay_once(
    pg_cluster: PrivateCluster, tmp_path: Path
) -> None:
    # A private cluster: the machine's shared server is never restarted by tests.
    url = pg_cluster.create_database("agentledger")
    pg_env = Env(tmp_path, url)
    try:
        # Each run is held inside its second write, its effect made and its outcome not
        # yet journaled: every run is in flight when the server restarts, however slowly
        # the machine runs (waiting for "started" let a fast run finish first).
        flags = [pg_env.hold_flag(f"r{n}") for n in range(6)]
        ids = [
            pg_env.submit("slow_writes", {"tag": f"r{n}", "n": 4, "pause": 0.3, "hold": {
                "item": f"r{n}-1", "phase": "after_effect", "flag": str(flag)}})
            for n, flag in enumerate(flags)
        ]  # fmt: skip
        pg_env.start_worker(lease=3.0)
        pg_env.start_worker(lease=3.0)
        for flag in flags:
            pg_env.wait_marker(flag)
        before = pg_cluster.postmaster_pid()
        assert not any(pg_env.run(i).status == RunStatus.COMPLETED for i in ids)
        pg_cluster.restart()
        assert pg_cluster.postmaster_pid() not in (None, before)
        for flag in flags:
            flag.unlink()
        for run_id in ids:
            pg_env.wait_status(run_id, RunStatus.COMPLETED, timeout=120)
        keys = [
            s.idempotency_key for i in ids for s in tool_steps(pg_env.journal(i), "keyed_write")
        ]
        assert len(keys) == 24
        assert pg_env.effects("keyed") == dict.fromkeys(keys, 1)
        for run_id in ids:
            run = pg_env.run(run_id)
            assert run.lease_owner is None, run
            journal = pg_env.journal(run_id)
            assert len({s.step_no for s in journal}) == len(journal) == 8
    finally:
        pg_env.close()


def test_concurrency_far_above_connections_does_not_deadlock(pg_env: Env) -> None:
    # One worker holds one writer connection and one listener, whatever its concurrency.
    with pg_env.one_store():  # the test's own reads and writes: one store, not one each
        ids = [pg_env.submit("quick", {"n": n}) for n in range(60)]
        pg_env.start_worker(concurrency=60)
        for run_id in ids:
            pg_env.wait_status(run_id, RunStatus.COMPLETED, timeout=90)
    assert len(pg_env.effects("keyed")) == 60
    assert set(pg_env.effects("keyed").values()) == {1}
