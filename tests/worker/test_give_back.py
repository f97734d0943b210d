"""A run the worker gives back after a store failure is released only under the lease
it held: when another worker took the run meanwhile (its lease expired while the
store refused this worker's writes), the release touches nothing and the log does not
claim the run was released. Real stores on each backend and the real worker."""

from __future__ import annotations

import logging

import pytest

from agentledger import App, Worker, WorkerConfig
from agentledger.store import NewRun, Store

TARGET = "agent@1"


async def test_giving_back_a_run_another_worker_took_over_releases_nothing(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker(store, App("give-back-tests"), WorkerConfig(store_retry_seconds=1))
    await store.create_run(NewRun(kind="agent", name="agent", version="1", input={}))
    (run,) = await store.claim_runs(worker.owner, [TARGET], 1, 30.0)
    assert await store.expire_leases_of([worker.owner]) == 1
    (taken,) = await store.claim_runs("w2", [TARGET], 1, 30.0)
    with caplog.at_level(logging.INFO, logger="agentledger.worker"):
        released = await worker._give_back(run.id, run.lease_epoch)
    lines = [r.getMessage() for r in caplog.records]
    assert released is False, lines
    assert any(f"run {run.id}" in line and "taken over" in line for line in lines), lines
    now = await store.get_run(run.id)
    assert now is not None and now.lease_owner == "w2" and now.lease_epoch == taken.lease_epoch
    assert now.status == "running"
