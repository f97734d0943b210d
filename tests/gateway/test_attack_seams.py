"""Attacks on the gateway's engine hooks (engine/_hooks.py, gateway/_engine.py): a hook
that raises mid-call, hooks installed twice, and the public test Harness with a tenant
budget, on both backends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import agentledger.gateway  # installs the hooks this module replaces
from agentledger.engine import _hooks as hooks
from agentledger.gateway import _engine as gateway_engine
from agentledger.gateway import _queries as gateway_budgets
from agentledger.records import RunStatus
from agentledger.testing import Harness
from tests.gateway.fakes import FakeProviders, openai_answer
from tests.gateway.worker_app import make_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def gateway_hooks() -> Iterator[None]:
    """The gateway's hooks before and after the test, whatever it installs."""
    gateway_engine.install()
    yield
    gateway_engine.install()


async def _tenant_spend(h: Harness) -> float:
    row = await h.store.transact(
        gateway_budgets.reserve_tenant_usage, "default", time.time(), 0.0, 0
    )
    return float(row["spend_usd"])


async def test_a_settle_hook_failing_after_the_answer_never_resends_the_call(
    store_url: str, fake: FakeProviders, gateway_hooks: None
) -> None:
    """The provider answered (and billed); settling the tenant's row then fails (the
    store, or a user's hook). The answer must not be thrown away and the call sent
    again: one request, the run goes on, the tenant row never under-counts."""
    settled: list[float] = []

    async def failing_settle(*args: Any) -> None:
        settled.append(args[3])
        raise RuntimeError("settle failed")

    fake.script(openai_answer("Three hotels."))
    async with Harness(make_app("openai:gpt-4.1-mini"), db=store_url) as h:
        await h.store.transact(gateway_budgets.set_tenant_budget, "default", 86_400, 10.0)
        hooks.install(settle_tenant=failing_settle)
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        run = await h.run_until_settled(run_id)
        assert len(fake.requests) == 1, fake.requests  # never sent twice
        assert settled, "the settle hook was never called"
        assert run.status == RunStatus.COMPLETED, (run.status, run.error, run.handover_reason)
        # Not settled: the row stays at the reservation, at least what the run spent.
        assert await _tenant_spend(h) >= run.cost_usd > 0


async def test_the_harness_enforces_a_tenant_budget(
    store_url: str, fake: FakeProviders, gateway_hooks: None
) -> None:
    """The public Harness (a user's tests) runs with the gateway: a tenant over its budget
    is refused, the call not sent."""
    fake.script(openai_answer("Three hotels."))
    async with Harness(make_app("openai:gpt-4.1-mini"), db=store_url) as h:
        await h.store.transact(
            gateway_budgets.set_tenant_budget, "default", 86_400, max_spend_usd=0.0001
        )
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        run = await h.run_until_settled(run_id, timeout=10)
        assert run.status == RunStatus.WAITING, run.status
        assert fake.requests == []
        assert await _tenant_spend(h) == 0.0


def test_installing_the_gateway_twice_keeps_one_set_of_hooks(gateway_hooks: None) -> None:
    """A reload (or a second import path) installs the same functions again: the hooks
    are the gateway's, not stacked wrappers, and the cooldowns stay one table."""
    import importlib

    from agentledger.gateway._cooldown import COOLDOWNS

    importlib.reload(agentledger.gateway)
    importlib.reload(agentledger.gateway)
    assert hooks.reserve_tenant.__module__ == "agentledger.gateway._engine"
    assert hooks.model_call_ended == COOLDOWNS.record
