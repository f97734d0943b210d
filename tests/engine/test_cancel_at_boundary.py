"""A cancel requested while a step runs stops the run at the very next step boundary.

The worker's heartbeat would learn of the cancel only every lease/3; here the lease is
long (the heartbeat does not come round during the test), so the run can only stop in
time because each journal write reads the run's cancel request back with its fence.
A real worker process holds the run inside a step; the test requests the cancel, then
lets the step end: the run ends ``cancelled`` and no later step starts.
"""

from __future__ import annotations

import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env


@pytest.fixture
def env(backend_env: Env) -> Env:
    """These tests run on every store backend."""
    return backend_env


@pytest.mark.parametrize("phase", ["before_started", "after_effect"])
def test_cancel_during_a_held_step_stops_at_the_next_boundary(env: Env, phase: str) -> None:
    # before_started: inside the local step pre_i2; after_effect: inside the write of i2.
    flag = env.hold_flag(f"cancel-{phase}")
    run_id = env.submit("five_writes", {"hold": {"item": "i2", "phase": phase, "flag": str(flag)}})
    env.start_worker(lease=120.0)  # heartbeat every 40 s: never during this test
    env.wait_marker(flag)
    env._store(lambda s: s.cancel_run(run_id, "changed my mind", "user:ann"))
    flag.unlink()  # the held step ends now
    run = env.wait_status(run_id, RunStatus.CANCELLED, RunStatus.COMPLETED)
    assert run.status == RunStatus.CANCELLED, "the run went on past the step boundary"
    assert "changed my mind" in (run.error or "")
    forward = [s for s in env.journal(run_id) if s.kind != "compensation"]
    held = "pre_i2" if phase == "before_started" else "keyed_write"
    # The held step is the last one that started: nothing after it ran.
    assert forward[-1].name == held, [s.name for s in forward]
    assert [s.name for s in forward].count("keyed_write") == (1 if held == "pre_i2" else 2)
