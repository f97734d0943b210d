"""A worker process killed (SIGKILL) during a model call, on each store: another worker
sends that call once more and never a journaled one, and the lost call's reserved spend
stays counted in the run's and the tenant's spend."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentledger.gateway import _queries as gateway_budgets
from agentledger.records import RunStatus, StepStatus
from tests.engine.helpers import Env
from tests.gateway import worker_app
from tests.gateway.fakes import FakeProviders, openai_answer

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WORKER_APP = "tests.gateway.worker_app:app"


def tenant_spend(env: Env, tenant: str) -> float:
    """The tenant's spend in the current period (a reservation of nothing reads it)."""
    row: Any = env._store(
        lambda s: s.transact(gateway_budgets.reserve_tenant_usage, tenant, time.time(), 0.0, 0)
    )
    assert row is not None
    return float(row["spend_usd"])


def test_a_worker_killed_during_a_model_call_costs_one_more_call_and_its_spend_counts(
    store_url: str, fake: FakeProviders, tmp_path: Path
) -> None:
    hold = threading.Event()
    lost = openai_answer("never read")
    lost.hold = hold  # the fake server keeps this answer while the worker dies
    fake.script(
        openai_answer(calls=[("lookup", '{"city": "Lisbon"}')]), lost, openai_answer("Answer.")
    )
    env = Env(tmp_path, store_url)
    try:
        env._store(
            lambda s: s.transact(
                gateway_budgets.set_tenant_budget, "default", 86_400, max_spend_usd=10.0
            )
        )
        run_id = str(
            env._store(lambda s: worker_app.app.submit(s, "concierge", {"message": "Hotels?"}))
        )
        # The long default lease (tests/engine/helpers.py): a busy machine never lapses
        # one mid-call (a lapse would let the same process claim the run again and
        # reserve the call a second time).
        first = env.start_worker(app=WORKER_APP)
        fake.wait_requests(2, 60)  # step 1 answered, step 3 sent and held
        env.kill(first)
        hold.set()
        steps = {s.step_no: s for s in env.journal(run_id)}
        assert steps[1].status == StepStatus.SUCCEEDED
        lost_step = steps[3]
        assert lost_step.status == StepStatus.STARTED
        reserved = lost_step.output["attempts"][-1]["reserved_usd"]
        assert reserved > 0 and lost_step.cost_usd == reserved
        # The tenant's period already holds the lost call at its reservation.
        assert tenant_spend(env, "default") == pytest.approx(steps[1].cost_usd + reserved)

        # Resumed by a burst worker in this process: it expires the dead worker's lease
        # before it claims (a dead local owner), as a worker process does.
        asyncio.run(worker_app.burst_here(store_url))
        run = env.run(run_id)
        assert run.status == RunStatus.COMPLETED, (run.status, run.error)
        assert run.result == {"answer": "Answer."}
        # Step 1 was never sent again, step 3 exactly once more, and the SDK retried nothing.
        assert len(fake.requests) == 3
        journal = env.journal(run_id)
        step3 = {s.step_no: s for s in journal}[3]
        assert [a["error_class"] for a in step3.output["attempts"]] == ["lost", None]
        answered = step3.output["attempts"][-1]["cost_usd"]
        assert step3.cost_usd == pytest.approx(reserved + answered)
        assert run.cost_usd == pytest.approx(sum(s.cost_usd for s in journal))
        assert tenant_spend(env, "default") == pytest.approx(run.cost_usd)
    finally:
        hold.set()
        env.close()
