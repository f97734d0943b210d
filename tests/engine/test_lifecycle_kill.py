"""A worker SIGKILLed mid-charge exactly at the step budget (issue item 2): the next
worker status-checks the charge before enforcing the budget, then refunds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env

pytestmark = pytest.mark.slow
APP = "tests.engine.lifecycle_kill_app:app"


def test_killed_mid_charge_at_max_steps_is_resolved_then_refunded(env: Env, tmp_path: Path) -> None:
    from tests.engine.lifecycle_kill_app import app

    flag = tmp_path / "hold-charge"
    flag.write_text("")
    run_id = str(
        env._store(lambda s: app.submit(s, "charge_at_limit", {"message": "go", "flag": str(flag)}))
    )
    # Long leases (the default): the killed worker's lease is reaped at once anyway, and
    # with a 1 s lease a stall of the loaded machine let the next worker claim the run
    # again (a third epoch).
    worker = env.start_worker(app=APP)
    env.wait_marker(flag)  # the provider charged; the worker holds before journaling it
    env.kill(worker)
    flag.unlink()
    assert env.run(run_id).step_count == 2  # model step + charge started: at max_steps
    env.start_worker(app=APP)
    run = env.wait_status(run_id, RunStatus.NEEDS_HUMAN)
    journal = env.journal(run_id)
    assert "step budget" in (run.handover_reason or "")
    assert [(s.kind, s.name, s.status) for s in journal] == [
        ("model", "scripted", "succeeded"),
        ("tool", "kcharge", "succeeded"),
        ("decision", "compensate", "succeeded"),
        ("compensation", "krefund", "succeeded"),
    ]
    assert env.effects("kcharge") == {journal[1].idempotency_key: 1}
    assert len(env.effects("krefund")) == 1
    events = [e.type for e in env.events(run_id)]
    assert "tool.resumed_unknown" in events and "tool.status_resolved" in events
