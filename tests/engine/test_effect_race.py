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
    first = env.submit("gift_flow", {"guest": "g-7", "hold": 1.5})
    second = env.submit("gift_flow", {"guest": "g-7", "hold": 1.5})
    env.start_worker(concurrency=1)
    env.start_worker(concurrency=1)
    # Both runs are in flight at once, on different workers.
    wait_for(
        lambda: len({env.run(first).lease_owner, env.run(second).lease_owner} - {None}) == 2,
        what="each run claimed by its own worker",
    )
    results = [env.wait_status(r, RunStatus.COMPLETED).result for r in (first, second)]
    assert results[0] == results[1]  # the waiter got the winner's result
    assert sum(env.calls("gift").values()) == 1  # one call at the provider, ever
    shared = [e for r in (first, second) for e in env.events(r) if e.type == "tool.effect_shared"]
    assert len(shared) == 1
