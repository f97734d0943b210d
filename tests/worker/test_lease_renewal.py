"""A renewal that misses a lease tells a run that finished from a lease really lost.

A heartbeat snapshots the active runs, then renews them; a run that finishes (or parks,
or is released) meanwhile clears its own lease under the fence, so the renewal misses
it. That is no loss: nothing is logged and its execution is left to finish. A lease
taken over by another worker still is a loss: logged, and the execution stopped.
Real stores on each backend (``store``) and the real worker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agentledger import App, RunStatus, Worker, WorkerConfig
from agentledger.records import Run
from agentledger.store import Batch, NewRun, RunUpdate, Store

TARGET = "agent@1"


def _worker(store: Store) -> Worker:
    return Worker(store, App("lease-tests"), WorkerConfig())


async def _claimed_by(store: Store, owner: str) -> Run:
    await store.create_run(NewRun(kind="agent", name="agent", version="1", input={}))
    (run,) = await store.claim_runs(owner, [TARGET], 1, 30.0)
    return run


def _unwinding() -> asyncio.Task[Any]:
    """Stands for the run's execution task, still returning after its last write."""
    return asyncio.create_task(asyncio.sleep(3600))


def _lost_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.WAITING, "released"])
async def test_a_run_that_gave_its_lease_back_is_not_reported_lost(
    store: Store, caplog: pytest.LogCaptureFixture, status: str
) -> None:
    worker = _worker(store)
    run = await _claimed_by(store, worker.owner)
    task = _unwinding()
    worker.active[run.id] = (task, run.lease_epoch)
    # The run's own last write lands between the heartbeat's snapshot and its renewal.
    if status == "released":
        assert await store.release_run(run.id, run.lease_epoch, worker.owner)
    else:
        update = RunUpdate(status=status, available_at=None, result={"ok": True})
        await store.commit(Batch(run.id, run.lease_epoch, worker.owner, run=update))
    with caplog.at_level(logging.INFO, logger="agentledger.worker"):
        await worker._heartbeat_once()
    await asyncio.sleep(0)
    assert _lost_lines(caplog) == []
    assert not task.done(), "a finishing execution was cancelled"
    assert worker.active[run.id] == (task, run.lease_epoch)  # its own exit cleans up
    task.cancel()


async def test_a_lease_taken_over_is_logged_lost_and_stops_the_execution(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    worker = _worker(store)
    run = await _claimed_by(store, worker.owner)
    task = _unwinding()
    worker.active[run.id] = (task, run.lease_epoch)
    await store.expire_leases_of([worker.owner])  # as a reaper does to a stalled owner
    (taken,) = await store.claim_runs("elsewhere", [TARGET], 1, 30.0)
    assert taken.lease_epoch == run.lease_epoch + 1
    with caplog.at_level(logging.INFO, logger="agentledger.worker"):
        await worker._heartbeat_once()
    await asyncio.gather(task, return_exceptions=True)
    assert _lost_lines(caplog) == [
        f"lease on run {run.id} (epoch {run.lease_epoch}) lost; stopping it"
    ]
    assert task.cancelled() and run.id not in worker.active


async def test_many_quick_runs_under_fast_heartbeats_log_no_lost_lease(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole worker: renewals every 10 ms race every run's finish."""
    app = App("lease-race")

    @app.workflow(name="quick")
    async def quick(ctx: Any, input: Any) -> Any:
        await asyncio.sleep(input["n"] % 3 * 0.01)
        return input["n"]

    ids = [await app.submit(store, "quick", {"n": n}) for n in range(60)]
    config = WorkerConfig(concurrency=20, poll_seconds=0.01, heartbeat_seconds=0.01)
    with caplog.at_level(logging.INFO, logger="agentledger.worker"):
        await Worker(store, app, config, burst=True).run(install_signals=False)
    runs = [await store.get_run(i) for i in ids]
    assert {r.status for r in runs if r is not None} == {RunStatus.COMPLETED}
    assert _lost_lines(caplog) == []
