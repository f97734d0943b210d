"""SIGKILL at each point of a chain of held writes: after the first write returned, and
after the last one returned (its outcome held for the run's ending write). Every write is
settled by its status check on resume, never called a second time, and the event stream
states each journal fact once, in order."""

from __future__ import annotations

import pytest

from agentledger.records import RunStatus, StepStatus
from tests.engine.helpers import Env, tool_steps

pytestmark = pytest.mark.slow


@pytest.fixture
def env(backend_env: Env) -> Env:
    return backend_env


@pytest.mark.parametrize("item", ["c1", "c3"])
def test_kill_while_an_outcome_is_held_settles_it_by_status(env: Env, item: str) -> None:
    flag = env.tmp / "die.flag"
    flag.write_text("die")
    run_id = env.submit("write_chain", {"die_after": {"item": item, "flag": str(flag)}})
    env.start_worker().wait(timeout=60)
    run = env.run(run_id)
    assert run.status == RunStatus.RUNNING and run.result is None
    writes = tool_steps(env.journal(run_id), "keyed_write")
    assert writes[-1].status == StepStatus.STARTED
    assert all(s.status == StepStatus.SUCCEEDED for s in writes[:-1])
    env.start_worker()
    env.wait_status(run_id, RunStatus.COMPLETED)
    writes = tool_steps(env.journal(run_id), "keyed_write")
    keys = [s.idempotency_key or "" for s in writes]
    assert [s.status for s in writes] == [StepStatus.SUCCEEDED] * 3
    assert env.calls("keyed") == dict.fromkeys(keys, 1)
    assert env.effects("keyed") == dict.fromkeys(keys, 1)
    events = env.events(run_id)
    assert [e.id for e in events] == sorted(e.id for e in events)
    facts = [
        (e.data["step_no"], e.type)
        for e in events
        if e.type.startswith("step.") and e.data.get("name") == "keyed_write"
    ]
    # One ``started`` and one ``succeeded`` per write, in order (the killed write's
    # outcome is written once, by its status check on resume).
    assert facts == [(n, t) for n in (1, 2, 3) for t in ("step.started", "step.succeeded")]
    assert events[-1].type == "run.completed"
