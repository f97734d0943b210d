"""A priced model call is never sent unchecked against its tenant's budget: a worker in a
process that never imported ``agentledger.gateway`` (whose hooks reserve and settle the
tenant's spend, engine/_hooks.py) refuses the step with a clear error; the provider gets
no request, the tenant's period row no spend, and the run is not failed by it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentledger.gateway import _queries as gateway_budgets
from agentledger.records import RunStatus
from agentledger.store import open_store
from tests.gateway import worker_app
from tests.gateway.fakes import FakeProviders, openai_answer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]

# A worker with the audit chain (agentledger.service) but not the gateway.
WORKER = """
import asyncio, sys
import agentledger.service
from agentledger import Worker, WorkerConfig, open_store
from tests.gateway.worker_app import app

async def main(url):
    store = open_store(url)
    await store.open()
    try:
        await Worker(store, app, WorkerConfig(poll_seconds=0.02, shutdown_grace=1.0),
                     burst=True).run(install_signals=False)
    finally:
        await store.close()

try:
    asyncio.run(main(sys.argv[1]))
except Exception as exc:
    print(type(exc).__name__, exc)
print("gateway imported:", any(m.startswith("agentledger.gateway") for m in sys.modules))
"""


async def _prepare(url: str) -> str:
    store = open_store(url)
    await store.open()
    try:
        await store.transact(gateway_budgets.set_tenant_budget, "default", 86_400, 10.0)
        return str(await worker_app.app.submit(store, "concierge", {"message": "Hotels?"}))
    finally:
        await store.close()


async def _after(url: str, run_id: str) -> tuple[Any, float]:
    store = open_store(url)
    await store.open()
    try:
        run = await store.get_run(run_id)
        row = await store.transact(
            gateway_budgets.reserve_tenant_usage, "default", time.time(), 0.0, 0
        )
        return run, float(row["spend_usd"])
    finally:
        await store.close()


async def _worker_with_the_gateway(url: str) -> None:
    """A burst worker in this process, which imported ``agentledger.gateway``."""
    assert "agentledger.gateway" in sys.modules
    await worker_app.burst_here(url)


def _worker(url: str) -> subprocess.CompletedProcess[str]:
    """A burst worker in a fresh process that never imported ``agentledger.gateway``."""
    code = WORKER
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", code, url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )


async def test_a_budgeted_model_step_refuses_without_the_gateway(
    store_url: str, fake: FakeProviders
) -> None:
    fake.script(openai_answer("Answer."))
    run_id = await _prepare(store_url)

    done = _worker(store_url)
    out = done.stdout
    assert "gateway imported: False" in out, (out, done.stderr)
    assert out.startswith("WorkerFailed"), (out, done.stderr)  # the worker stopped, loud
    assert "import agentledger.gateway" in out and "not sent" in out, out
    assert fake.requests == []  # nothing reached the provider
    run, spend = await _after(store_url, run_id)
    # Given back untouched for a worker that has the gateway.
    assert run is not None and run.status == RunStatus.QUEUED and run.error is None, run
    assert spend == 0.0

    # The same run with the gateway (this process imported it: tests/conftest.py): sent
    # once, reserved and settled against the budget.
    await _worker_with_the_gateway(store_url)
    assert len(fake.requests) == 1
    run, spend = await _after(store_url, run_id)
    assert run is not None and run.status == RunStatus.COMPLETED, run
    assert spend > 0.0
