"""A write's outcome carried by the run's next write (docs/architecture.md, "One step").

Back-to-back writes commit once each: a write's plain success is held and goes in the
same transaction as the next write's ``started``. The unknown-outcome protocol stays
exact: ``started`` is durable before every call, so a worker killed between a call and
the commit of its outcome leaves ``started``, which resume settles by the status check,
never by a second call.
"""

from __future__ import annotations

import pytest

from agentledger.records import RunStatus, StepStatus
from tests.engine.helpers import Env, tool_steps


@pytest.fixture
def env(backend_env: Env) -> Env:
    """These tests run on every store backend."""
    return backend_env


pytestmark = pytest.mark.slow


def _keys(env: Env, run_id: str) -> list[str]:
    return [s.idempotency_key or "" for s in tool_steps(env.journal(run_id), "keyed_write")]


def test_held_outcome_lost_in_a_kill_is_status_checked_not_called_again(env: Env) -> None:
    flag = env.tmp / "die.flag"
    flag.write_text("die")
    run_id = env.submit("write_chain", {"die_after": {"item": "c2", "flag": str(flag)}})
    first = env.start_worker()
    # The first worker kills itself right after c2 returned: c2's outcome was held.
    first.wait(timeout=60)
    writes = tool_steps(env.journal(run_id), "keyed_write")
    assert [s.status for s in writes] == [StepStatus.SUCCEEDED, StepStatus.STARTED]
    env.start_worker()
    env.wait_status(run_id, RunStatus.COMPLETED)
    writes = tool_steps(env.journal(run_id), "keyed_write")
    assert [s.status for s in writes] == [StepStatus.SUCCEEDED] * 3
    keys = _keys(env, run_id)
    # One call per key: c2 was found by its status check, not called a second time.
    assert env.calls("keyed") == dict.fromkeys(keys, 1)
    assert env.effects("keyed") == dict.fromkeys(keys, 1)
    assert [s.lease_epoch for s in writes] == [1, 2, 2]
    resumed = [e for e in env.events(run_id) if e.type == "tool.resumed_unknown"]
    assert [e.data["key"] for e in resumed] == [keys[1]]


def test_kill_between_intent_and_call_finds_the_carried_outcome_durable(env: Env) -> None:
    flag = env.hold_flag("hold")
    run_id = env.submit(
        "write_chain", {"hold": {"item": "c2", "phase": "after_started", "flag": str(flag)}}
    )
    first = env.start_worker()
    env.wait_marker(flag)
    # c2 is being called: its ``started`` is durable, and with it c1's outcome.
    writes = tool_steps(env.journal(run_id), "keyed_write")
    assert [s.status for s in writes] == [StepStatus.SUCCEEDED, StepStatus.STARTED]
    env.kill(first)
    flag.unlink()
    env.start_worker()
    env.wait_status(run_id, RunStatus.COMPLETED)
    writes = tool_steps(env.journal(run_id), "keyed_write")
    keys = _keys(env, run_id)
    # c1 settled under the first lease; c2 was checked (not found) and called once.
    assert [s.lease_epoch for s in writes] == [1, 2, 2]
    assert env.calls("keyed") == dict.fromkeys(keys, 1)
    assert env.effects("keyed") == dict.fromkeys(keys, 1)
    resumed = [e for e in env.events(run_id) if e.type == "tool.resumed_unknown"]
    assert [e.data["key"] for e in resumed] == [keys[1]]


def test_cancel_read_back_by_a_carried_entry_stops_before_the_call(env: Env) -> None:
    # c2 is held inside its call while the cancel is requested; its outcome is then
    # carried by c3's ``started``, whose fence reads the cancel back: c3 is not called.
    flag = env.hold_flag("cancel")
    run_id = env.submit(
        "write_chain", {"hold": {"item": "c2", "phase": "after_effect", "flag": str(flag)}}
    )
    env.start_worker(lease=120.0)  # no heartbeat during the test: only fences see it
    env.wait_marker(flag)
    env._store(lambda s: s.cancel_run(run_id, "changed my mind", "user:ann"))
    flag.unlink()
    run = env.wait_status(run_id, RunStatus.CANCELLED, RunStatus.COMPLETED)
    assert run.status == RunStatus.CANCELLED
    writes = tool_steps(env.journal(run_id), "keyed_write")
    assert [s.status for s in writes] == [StepStatus.SUCCEEDED] * 2 + [StepStatus.FAILED]
    assert writes[2].error_class == "refused" and "not called" in (writes[2].error or "")
    calls = env.calls("keyed")
    assert writes[2].idempotency_key not in calls
    assert [calls[s.idempotency_key or ""] for s in writes[:2]] == [1, 1]
