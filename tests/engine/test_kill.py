"""Kill the worker (SIGKILL, SIGSTOP/SIGCONT, SIGTERM) and check exactly-once effects."""

from __future__ import annotations

import signal

import pytest

from agentledger.records import RunStatus, StepStatus
from tests.engine.helpers import Env, tool_steps, wait_for
from tests.engine.zombie import zombie_write_is_fenced


@pytest.fixture
def env(backend_env: Env) -> Env:
    """These tests run on every store backend."""
    return backend_env


pytestmark = pytest.mark.slow

PHASES = ["before_started", "after_started", "after_effect", "after_outcome"]


def _kill_mid_run(env: Env, phase: str, item: str = "i3") -> str:
    flag = env.tmp / "hold.flag"
    flag.write_text("hold")
    run_id = env.submit("five_writes", {"hold": {"item": item, "phase": phase, "flag": str(flag)}})
    first = env.start_worker()
    env.wait_marker(flag)
    env.kill(first)
    flag.unlink()
    env.start_worker()
    env.wait_status(run_id, RunStatus.COMPLETED)
    return run_id


def _assert_exactly_once(env: Env, run_id: str) -> None:
    journal = env.journal(run_id)
    writes = tool_steps(journal, "keyed_write")
    assert len(writes) == 5
    assert all(s.status == StepStatus.SUCCEEDED for s in journal)
    keys = [s.idempotency_key for s in writes]
    assert env.effects("keyed") == dict.fromkeys(keys, 1)


def test_sigkill_mid_write_resumes_on_second_worker_with_one_effect(env: Env) -> None:
    run_id = _kill_mid_run(env, "after_effect")
    _assert_exactly_once(env, run_id)
    writes = tool_steps(env.journal(run_id), "keyed_write")
    calls = env.calls("keyed")
    # Earlier writes succeeded under the first lease and were not re-executed.
    for step in writes[:2]:
        assert step.lease_epoch == 1
        assert calls[step.idempotency_key] == 1
    # The held write completed under the new lease, resolved by a status check.
    held = writes[2]
    assert held.lease_epoch == 2
    assert calls[held.idempotency_key] == 1
    assert env.run(run_id).lease_epoch == 2
    assert any(e.type == "tool.resumed_unknown" for e in env.events(run_id))


@pytest.mark.parametrize("phase", PHASES)
def test_kill_at_every_step_boundary_is_exactly_once(env: Env, phase: str) -> None:
    run_id = _kill_mid_run(env, phase)
    _assert_exactly_once(env, run_id)
    writes = tool_steps(env.journal(run_id), "keyed_write")
    calls = env.calls("keyed")
    for step in writes[:2]:
        assert calls[step.idempotency_key] == 1
    held = writes[2]
    # The held call either never reached the provider (after_started: the status
    # check says not found and the one call is made again with the same key) or its
    # effect is found by the status check: one provider call either way.
    assert calls[held.idempotency_key] == 1
    assert held.lease_epoch == (1 if phase == "after_outcome" else 2)
    assert env.run(run_id).lease_epoch == 2


def test_zombie_write_while_the_new_owner_is_mid_run_is_rejected(env: Env) -> None:
    """A stopped worker wakes up inside a write while its successor is mid-run."""
    zombie_write_is_fenced(env, "after_effect")


def test_sigterm_releases_runs_in_flight_and_loses_nothing(env: Env) -> None:
    ids = [env.submit("slow_writes", {"tag": f"t{n}", "n": 4, "pause": 0.4}) for n in range(4)]
    worker = env.start_worker()
    with env.one_store():
        wait_for(lambda: all(env.run(i).step_count >= 1 for i in ids), what="all runs started")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    for run_id in ids:
        run = env.run(run_id)
        assert run.status in (RunStatus.COMPLETED, RunStatus.QUEUED), run
        assert run.lease_owner is None and run.lease_expires_at is None, run
    assert any(env.run(i).status == RunStatus.QUEUED for i in ids)
    env.start_worker()
    for run_id in ids:
        env.wait_status(run_id, RunStatus.COMPLETED)
    keys = [s.idempotency_key for i in ids for s in tool_steps(env.journal(i), "keyed_write")]
    assert len(keys) == 16
    assert env.effects("keyed") == dict.fromkeys(keys, 1)
    assert env.calls("keyed") == dict.fromkeys(keys, 1)


def test_agent_resume_does_not_call_the_model_again_for_journaled_steps(env: Env) -> None:
    flag = env.tmp / "hold.flag"
    flag.write_text("hold")
    turns = [
        {"calls": [["read_tool", {"x": "a"}]]},
        {"calls": [["keyed_write", {"item": "w"}]]},
        {"text": "all done"},
    ]
    run_id = env.submit(
        "scripted",
        {"turns": turns, "hold": {"item": "w", "phase": "after_effect", "flag": str(flag)}},
    )
    first = env.start_worker()
    env.wait_marker(flag)
    env.kill(first)
    flag.unlink()
    env.start_worker()
    run = env.wait_status(run_id, RunStatus.COMPLETED)
    assert run.result == {"answer": "all done"}
    model_calls = env.calls("model")
    assert model_calls == {f"{run_id}:turn0": 1, f"{run_id}:turn1": 1, f"{run_id}:turn2": 1}
    journal = env.journal(run_id)
    assert [(s.kind, s.lease_epoch) for s in journal] == [
        ("model", 1),
        ("tool", 1),
        ("model", 1),
        ("tool", 2),
        ("model", 2),
    ]
    assert env.calls("read") == {f"{run_id}:2": 1}
    assert env.effects("keyed") == {f"{run_id}:4": 1}
