"""Lease renewal per epoch, cancel requests and one execution per run, in process."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from agentledger import App
from agentledger.worker import Worker, WorkerConfig
from agentledger.worker import _worker as worker_module


class FakeStore:
    """Just what the heartbeat needs; ``on_renew`` runs while a renewal is in flight."""

    def __init__(self) -> None:
        self.lost: set[str] = set()
        self.cancels: dict[str, str] = {}
        self.on_renew: Any = None
        self.renewed: list[dict[str, int]] = []

    async def renew_leases(self, owner: str, leases: dict[str, int], seconds: float) -> set[str]:
        self.renewed.append(dict(leases))
        if self.on_renew is not None:
            self.on_renew()
        return set(self.lost)

    async def heartbeat_worker(self, worker_id: str) -> None:
        return None

    async def cancel_requests(self, run_ids: list[str]) -> dict[str, str]:
        return {r: why for r, why in self.cancels.items() if r in run_ids}

    async def release_run(self, run_id: str, epoch: int, owner: str) -> bool:
        return True

    async def get_run(self, run_id: str) -> Any:
        # Taken over: a newer epoch (a run that gave its lease back is tested on real
        # stores in test_lease_renewal.py).
        return SimpleNamespace(id=run_id, lease_epoch=1_000, status="running")


def _worker(store: FakeStore) -> Worker:
    return Worker(store, App("heartbeat-tests"), WorkerConfig())  # type: ignore[arg-type]


def _forever() -> asyncio.Task[Any]:
    return asyncio.create_task(asyncio.sleep(3600))


async def test_a_stale_snapshot_does_not_cancel_a_newer_execution_of_the_run() -> None:
    store = FakeStore()
    worker = _worker(store)
    old, new = _forever(), _forever()
    worker.active["r1"] = (old, 1)

    def reclaimed_meanwhile() -> None:
        # While the renewal of epoch 1 is in flight, this worker re-claims the run
        # (epoch 2); the store then reports epoch 1 lost.
        worker.active["r1"] = (new, 2)

    store.on_renew, store.lost = reclaimed_meanwhile, {"r1"}
    await worker._heartbeat_once()
    await asyncio.sleep(0)
    assert store.renewed == [{"r1": 1}]
    assert not new.done(), "the fresh execution was cancelled by a stale renewal"
    assert worker.active["r1"] == (new, 2)
    for task in (old, new):
        task.cancel()


async def test_a_lost_lease_stops_the_execution_that_held_it() -> None:
    store = FakeStore()
    worker = _worker(store)
    task = _forever()
    worker.active["r1"] = (task, 3)
    store.lost = {"r1"}
    await worker._heartbeat_once()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and "r1" not in worker.active


async def test_cancel_requests_are_refreshed_for_active_runs() -> None:
    store = FakeStore()
    worker = _worker(store)
    tasks = [_forever(), _forever()]
    worker.active.update({"r1": (tasks[0], 1), "r2": (tasks[1], 1)})
    store.cancels = {"r1": "operator said stop", "other": "not ours"}
    await worker._heartbeat_once()
    assert worker.cancel_requests == {"r1": "operator said stop"}
    store.cancels = {}
    await worker._heartbeat_once()
    assert worker.cancel_requests == {}
    for task in tasks:
        task.cancel()


async def test_one_run_never_executes_twice_at_once_in_one_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run re-claimed while our earlier execution still unwinds waits for it to end."""
    running: list[int] = []
    overlap: list[int] = []
    started = asyncio.Event()

    async def fake_execute_run(store: Any, app: Any, run: Any, owner: str, **kw: Any) -> str:
        running.append(run.lease_epoch)
        overlap.append(len(running))
        started.set()
        try:
            await asyncio.sleep(0.05 if run.lease_epoch == 2 else 3600)
        finally:
            # Unwinding takes a moment (as a tool call being cancelled may).
            await asyncio.shield(asyncio.sleep(0.02))
            running.remove(run.lease_epoch)
        return "completed"

    monkeypatch.setattr(worker_module, "execute_run", fake_execute_run)
    worker = _worker(FakeStore())
    worker._start(SimpleNamespace(id="r1", lease_epoch=1))  # type: ignore[arg-type]
    await started.wait()
    first = worker.active["r1"][0]
    worker._start(SimpleNamespace(id="r1", lease_epoch=2))  # type: ignore[arg-type]
    second = worker.active["r1"][0]
    assert await second == "completed"
    assert first.cancelled()
    assert overlap == [1, 1]
    assert "r1" not in worker.active and worker._tasks == {}
