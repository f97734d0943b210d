"""A cancel that lands while a run parks (after its last step's write, before the park
commits) is not left waiting out the park: the parked run is due at once, so a worker
honours the cancel now rather than when the sleep (or an approval) would have ended."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agentledger import App, RunStatus
from agentledger.store._base import Batch
from tests.fast.lifecycle_harness import Harness

LONG = 400 * 86400.0  # past the harness clock's 30 days in the past: a park in the future


def _app() -> App:
    app = App("cancel-park")

    @app.workflow(name="sleeper")
    async def sleeper(ctx: Any, input: Any) -> Any:
        await ctx.sleep(LONG)
        return "woke"

    return app


async def test_a_cancel_between_the_sleep_step_and_the_park_is_due_at_once(
    tmp_path: Path,
) -> None:
    async with Harness(tmp_path, _app()) as h:
        run_id = await h.submit("sleeper")
        spied = h.store.commit

        async def cancel_after_the_sleep_step(batch: Batch) -> None:
            await spied(batch)
            if any(s.name == "sleep" for s in batch.steps):  # the next write is the park
                await h.store.cancel_run(run_id, "not needed", "ops:alice")

        h.store.commit = cancel_after_the_sleep_step  # type: ignore[method-assign]
        assert await h.execute(run_id) == RunStatus.WAITING
        h.store.commit = spied  # type: ignore[method-assign]
        run = await h.run(run_id)
        assert run.cancel_requested == "not needed"
        # Due now (by the database's clock), not in 400 days.
        assert run.available_at is not None and run.available_at <= time.time() + 5, run
        claimed = await h.store.claim_runs("w9", [run.target], 10, 30.0)
        assert [r.id for r in claimed] == [run_id]
