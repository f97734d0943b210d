"""A worker runs the side tasks its builder composed (worker/_companions.py), supervised
like its own loops, and each one's exit pass once after its runs are released; the
worker itself starts no feature's loop."""

from __future__ import annotations

from typing import Any

from agentledger import App, Worker, WorkerConfig
from agentledger.records import RunStatus
from agentledger.store import Store
from agentledger.worker import Companion


async def test_a_burst_worker_runs_its_companions_and_their_exit_passes(store: Store) -> None:
    app = App("companions")

    @app.workflow(name="quick")
    async def quick(ctx: Any, input: Any) -> Any:
        return input

    seen: list[str] = []

    def loop(worker: Worker) -> Any:
        async def once() -> None:
            seen.append("loop")
            await worker.stopping.wait()

        return once

    async def at_exit(worker: Worker) -> None:
        assert not worker.active  # after the runs are released
        seen.append("exit")

    run_id = await app.submit(store, "quick", {"n": 1})
    worker = Worker(
        store,
        app,
        WorkerConfig(poll_seconds=0.02),
        burst=True,
        companions=[Companion("probe", loop, at_exit)],
    )
    await worker.run(install_signals=False)
    run = await store.get_run(run_id)
    assert run is not None and run.status == RunStatus.COMPLETED
    assert seen == ["loop", "exit"]


def test_the_cli_worker_composes_the_stuck_detector_and_the_webhook_dispatcher() -> None:
    from agentledger.cli._ops import worker_companions

    assert [c.name for c in worker_companions(WorkerConfig())] == ["stuck", "webhooks"]
    assert [c.name for c in worker_companions(WorkerConfig(webhooks=False))] == ["stuck"]
