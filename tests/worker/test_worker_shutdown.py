"""Stopping a worker by hand: each run released at the end of the grace is logged, and
a second Ctrl-C stops at once, releasing what is in flight (real processes, signals)."""

from __future__ import annotations

import signal

import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env
from tests.worker.procs import wait_log

pytestmark = pytest.mark.slow
PHASE = "after_effect"  # inside the tool call: the grace ends mid-write


def _held(env: Env) -> tuple[str, object]:
    flag = env.hold_flag("shutdown")
    run_id = env.submit("five_writes", {"hold": {"item": "i1", "phase": PHASE, "flag": str(flag)}})
    return run_id, flag


def test_a_run_released_at_the_end_of_the_grace_is_logged(env: Env) -> None:
    run_id, flag = _held(env)
    worker = env.start_worker(extra=("--shutdown-grace", "0.5"))
    env.wait_marker(flag)  # type: ignore[arg-type]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    log = env.worker_log(1)
    assert f"run {run_id} released (stopped inside a step by the end of the grace" in log, log
    assert env.run(run_id).status == RunStatus.QUEUED


def test_a_second_sigint_stops_at_once_and_releases_what_is_in_flight(env: Env) -> None:
    run_id, flag = _held(env)
    worker = env.start_worker(extra=("--shutdown-grace", "600"))
    env.wait_marker(flag)  # type: ignore[arg-type]
    worker.send_signal(signal.SIGINT)
    wait_log(env, 1, "draining 1 runs")
    worker.send_signal(signal.SIGINT)
    # Far inside the 600 s grace: the second signal, not the grace, ended it.
    assert worker.wait(timeout=60) == 0
    log = env.worker_log(1)
    assert "second signal (SIGINT): stopping now; 1 runs in flight are released" in log, log
    assert f"run {run_id} released (stopped inside a step by the second signal" in log, log
    run = env.run(run_id)
    assert run.status == RunStatus.QUEUED and run.lease_owner is None, run
