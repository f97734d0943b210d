"""A worker stopped (SIGSTOP) past its lease while a write's outcome would be held, its
run taken over and carried on by another worker, then woken (SIGCONT): its held outcome
and the ``started`` entry that carries it are refused by the fence, and no provider call
is made twice per key (only a late call the provider deduplicates by its key)."""

from __future__ import annotations

import signal

import pytest

from agentledger.records import RunStatus, StepStatus
from tests.engine.helpers import Env, tool_steps, wait_for
from tests.engine.zombie import relay_for
from tests.pgrelay import via

pytestmark = pytest.mark.slow


@pytest.fixture
def env(backend_env: Env) -> Env:
    return backend_env


@pytest.mark.parametrize("phase", ["after_started", "after_effect"])
def test_a_woken_zombie_cannot_commit_its_held_outcome_nor_call_the_next_write(
    env: Env, phase: str
) -> None:
    flag_a, flag_b = env.hold_flag(f"zombie-{phase}"), env.hold_flag(f"successor-{phase}")
    holds = [
        {"item": "c2", "phase": phase, "flag": str(flag_a), "once": True},
        {"item": "c3", "phase": "after_started", "flag": str(flag_b), "once": True},
    ]
    run_id = env.submit("write_chain", {"hold": holds})
    relay = relay_for(env)
    n_zombie = len(env.workers) + 1
    zombie = env.start_worker(
        lease=3.0, extra=("-v",), db=relay and via(env.url, "127.0.0.1", relay.port)
    )
    env.wait_marker(flag_a)
    owner_a = env.run(run_id).lease_owner
    env.stop_after_heartbeat(zombie, run_id)
    try:
        env.start_worker()  # the successor: a long lease, no third epoch on a stall
        env.wait_marker(flag_b)  # the successor settled c2 and is inside c3's call
        taken = env.run(run_id)
        assert taken.status == RunStatus.RUNNING and taken.lease_epoch == 2
        journal_b = env.journal(run_id)
        by_a_before = [e.id for e in env.events(run_id) if e.actor == owner_a]
        writes = tool_steps(journal_b, "keyed_write")
        assert [s.status for s in writes] == [StepStatus.SUCCEEDED] * 2 + [StepStatus.STARTED]
        flag_a.unlink()
        if relay is not None:
            relay.hold(lambda name: not name.endswith(":journal"))
    finally:
        zombie.send_signal(signal.SIGCONT)
    wait_for(
        lambda: env.lease_lost_by_fence(n_zombie) or env.journal(run_id) != journal_b,
        what=f"the zombie's late write; its log: {env.tmp}/worker{n_zombie}.log",
    )
    if relay is not None:
        relay.release()
    assert env.journal(run_id) == journal_b, "the zombie's late write was accepted"
    assert [e.id for e in env.events(run_id) if e.actor == owner_a] == by_a_before
    flag_b.unlink()
    run = env.wait_status(run_id, RunStatus.COMPLETED)
    assert run.lease_epoch == 2
    writes = tool_steps(env.journal(run_id), "keyed_write")
    keys = [s.idempotency_key or "" for s in writes]
    assert env.effects("keyed") == dict.fromkeys(keys, 1)
    calls = env.calls("keyed")
    # c3 was called by the successor only: the zombie's ``started`` was refused.
    assert calls[keys[2]] == 1 and calls[keys[0]] == 1
    assert calls[keys[1]] == (2 if phase == "after_started" else 1)
    assert [s.lease_epoch for s in writes] == [1, 2, 2]
