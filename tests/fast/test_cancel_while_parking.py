"""A cancel that lands while a run parks (after its last step's write, before the park
commits) is not left waiting out the park: the parked run is due at once, so a worker
honours the cancel now rather than when the sleep (or an approval) would have ended, and
the worker's line about the run says so."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from agentledger import App, RunStatus
from agentledger.engine._runner import execute_run
from agentledger.store._base import Batch
from agentledger.worker._runlog import log_outcome
from tests.fast.lifecycle_harness import Harness

LONG = 400 * 86400.0  # past the harness clock's 30 days in the past: a park in the future


def _app() -> App:
    app = App("cancel-park")

    @app.workflow(name="sleeper")
    async def sleeper(ctx: Any, input: Any) -> Any:
        await ctx.sleep(LONG)
        return "woke"

    return app


def _cancel_while_parking(h: Harness, run_id: str) -> Any:
    """Make the store cancel ``run_id`` right after the sleep step's write, before the
    park commits; return the store's own commit, to put back."""
    spied = h.store.commit

    async def cancel_after_the_sleep_step(batch: Batch) -> None:
        await spied(batch)
        if any(s.name == "sleep" for s in batch.steps):  # the next write is the park
            await h.store.cancel_run(run_id, "not needed", "ops:alice")

    h.store.commit = cancel_after_the_sleep_step  # type: ignore[method-assign]
    return spied


async def test_a_cancel_between_the_sleep_step_and_the_park_is_due_at_once(
    tmp_path: Path,
) -> None:
    async with Harness(tmp_path, _app()) as h:
        run_id = await h.submit("sleeper")
        spied = _cancel_while_parking(h, run_id)
        assert await h.execute(run_id) == RunStatus.WAITING
        h.store.commit = spied  # type: ignore[method-assign]
        run = await h.run(run_id)
        assert run.cancel_requested == "not needed"
        # Due now (by the database's clock), not in 400 days.
        assert run.available_at is not None and run.available_at <= time.time() + 5, run
        claimed = await h.store.claim_runs("w9", [run.target], 10, 30.0)
        assert [r.id for r in claimed] == [run_id]


# The worker's line about a run is made from the run object the execution left, not
# read back: after the cancel's poke, the object (and so the line) must say the run is
# due to honour the cancel, not that it waits out its 400-day sleep.


async def test_a_parked_run_made_due_by_a_cancel_is_logged_as_due(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with Harness(tmp_path, _app()) as h:
        run_id = await h.submit("sleeper")
        spied = _cancel_while_parking(h, run_id)
        run = await h.claim(run_id, "w1")
        outcome = await execute_run(h.store, h.app, run, "w1", clock=h.clock)
        h.store.commit = spied  # type: ignore[method-assign]
        assert outcome == RunStatus.WAITING
        stored = await h.run(run_id)
        # What the execution left on the object is where the run rests.
        assert (run.status, run.available_at) == (stored.status, stored.available_at), (
            run,
            stored,
        )
        assert run.cancel_requested == "not needed"
        with caplog.at_level(logging.INFO, logger="agentledger.worker"):
            await log_outcome(h.store, run, outcome)
        (line,) = [r.getMessage() for r in caplog.records if r.name == "agentledger.worker"]
        far = time.strftime("%H:%M:%S", time.localtime(h.clock.now() + LONG))
        assert "sleeping" not in line and far not in line, line
        assert "cancel" in line, line
