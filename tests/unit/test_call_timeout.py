"""A call's timeout (engine ``call_with_timeout``): the deadline's cancel becomes
``ToolTimeout`` and is taken back off the task; any other cancel stays a cancel."""

from __future__ import annotations

import asyncio

import pytest

from agentledger.engine._retries import call_with_timeout
from agentledger.errors import DeadlineReached, ToolTimeout


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_a_call_past_its_deadline_is_a_timeout_and_leaves_no_cancel_behind() -> None:
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(ToolTimeout, match=r"no answer within 0\.01 s"):
        await call_with_timeout(_forever, 0.01)
    assert task.cancelling() == 0
    await asyncio.sleep(0)  # no cancel is left pending on the task either


async def test_a_call_that_answers_in_time_returns_its_answer_and_leaves_no_timer() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 7

    loop = asyncio.get_running_loop()
    assert await call_with_timeout(answer, 30.0) == 7
    live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    assert not any(h._when > loop.time() + 20 for h in live)


async def test_a_cancel_from_outside_during_the_call_stays_a_cancel() -> None:
    started = asyncio.Event()

    async def call() -> None:
        started.set()
        await _forever()

    task = asyncio.create_task(call_with_timeout(call, 30.0))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancel_from_outside_after_the_deadline_fired_stays_a_cancel() -> None:
    async def call() -> None:
        try:
            await _forever()
        finally:
            # The deadline's cancel arrived; a second, outside cancel comes before the
            # call has unwound: the task is being cancelled, not timed out.
            asyncio.current_task().cancel()  # type: ignore[union-attr]
            await asyncio.sleep(0)

    task = asyncio.create_task(call_with_timeout(call, 0.01))
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_tools_own_timeout_error_is_a_timeout() -> None:
    async def call() -> None:
        raise TimeoutError("upstream gave up")

    with pytest.raises(ToolTimeout):
        await call_with_timeout(call, 30.0)


async def test_no_time_left_means_not_called() -> None:
    called = []

    async def call() -> None:
        called.append(1)

    for left in (0.0, -1.0, float("nan")):
        with pytest.raises(DeadlineReached):
            await call_with_timeout(call, left)
    assert not called
