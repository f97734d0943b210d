"""A worker told to stop (SIGTERM) while a write is being called: the write returns, its
outcome is held, and the boundary before the next write gives the run back with that
outcome committed first. The next worker neither calls nor status-checks it again."""

from __future__ import annotations

import signal

import pytest

from agentledger.records import RunStatus, StepStatus
from tests.engine.helpers import Env, tool_steps, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def env(backend_env: Env) -> Env:
    return backend_env


def test_a_graceful_stop_commits_the_held_outcome_before_giving_the_run_back(env: Env) -> None:
    flag = env.hold_flag("term")
    run_id = env.submit(
        "write_chain", {"hold": {"item": "c2", "phase": "after_effect", "flag": str(flag)}}
    )
    first = env.start_worker(lease=30.0, extra=("--shutdown-grace", "20"))
    env.wait_marker(flag)
    first.send_signal(signal.SIGTERM)
    # Release the tool only once the worker has taken the signal in: a signal and the
    # tool's return landing in one turn of its event loop may legitimately run the
    # next boundary before the signal's handler, and the run would then just go on.
    wait_for(lambda: "stopping: draining" in env.worker_log(1), 30, "the worker to stop")
    flag.unlink()
    assert first.wait(timeout=30) == 0, env.worker_log(1)
    run = env.run(run_id)
    assert run.status != RunStatus.COMPLETED and run.lease_owner is None
    writes = tool_steps(env.journal(run_id), "keyed_write")
    assert [s.status for s in writes] == [StepStatus.SUCCEEDED] * 2
    env.start_worker()
    env.wait_status(run_id, RunStatus.COMPLETED)
    writes = tool_steps(env.journal(run_id), "keyed_write")
    keys = [s.idempotency_key or "" for s in writes]
    assert env.calls("keyed") == dict.fromkeys(keys, 1)
    assert [s.lease_epoch for s in writes] == [1, 1, 2]
    assert not [e for e in env.events(run_id) if e.type == "tool.resumed_unknown"]
