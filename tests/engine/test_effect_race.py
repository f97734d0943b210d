"""Two workers racing for one effects-table key: one calls, the other waits for its result."""

from __future__ import annotations

import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env, wait_for


@pytest.fixture
def env(backend_env: Env) -> Env:
    """These tests run on every store backend."""
    return backend_env


@pytest.mark.slow
def test_two_workers_racing_for_one_effect_key_call_once(env: Env) -> None:
    # The step that wins the key holds while the flag exists, so both runs are in flight
    # at once however slowly the machine runs; the test waits for that, then lets go.
    flag = env.hold_flag("gift")
    env.start_worker(concurrency=1)
    env.start_worker(concurrency=1)
    # Both workers up and polling before the runs exist: each claims one at once (a
    # worker still starting would otherwise miss the hold window of the tool's timeout).
    with env.one_store():
        wait_for(lambda: len(env._store(lambda s: s.list_workers())) == 2, what="both workers up")
    first = env.submit("gift_flow", {"guest": "g-7", "flag": str(flag)})
    second = env.submit("gift_flow", {"guest": "g-7", "flag": str(flag)})
    env.wait_marker(flag)  # the winner is inside the provider call, holding
    wait_for(
        lambda: len({env.run(first).lease_owner, env.run(second).lease_owner} - {None}) == 2,
        what="each run claimed by its own worker",
    )
    flag.unlink()
    results = [env.wait_status(r, RunStatus.COMPLETED).result for r in (first, second)]
    assert results[0] == results[1]  # the waiter got the winner's result
    assert sum(env.calls("gift").values()) == 1  # one call at the provider, ever
    shared = [e for r in (first, second) for e in env.events(r) if e.type == "tool.effect_shared"]
    assert len(shared) == 1
