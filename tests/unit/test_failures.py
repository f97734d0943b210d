"""A failing store is logged once per cause, and once when it works again: by the worker's
loops, the one seal loop (workers and ``serve``) and the webhook dispatcher."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from agentledger import _sealer as sealer
from agentledger._failures import FailureLog
from agentledger.errors import StoreUnavailable
from agentledger.service._webhooks import Dispatcher

LOG = logging.getLogger("test.failures")


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_each_cause_is_logged_once_until_the_failing_loop_works_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, LOG.name)
    failures = FailureLog(LOG)
    failures.failed("heartbeat", StoreUnavailable("database disk full (UPDATE workers ...)"))
    failures.failed("claim", StoreUnavailable("database disk full (UPDATE runs ...)"))
    failures.failed("run r1", StoreUnavailable("database disk full"))
    assert _lines(caplog, logging.ERROR) == [
        "store failing: database disk full (UPDATE workers ...) (heartbeat; retrying)"
    ]
    assert failures.knows(StoreUnavailable("database disk full (INSERT ...)"))
    failures.recovered("stuck")  # never failed: proves nothing
    assert _lines(caplog, logging.INFO) == []
    failures.recovered("heartbeat")
    failures.recovered("claim")  # said once
    assert _lines(caplog, logging.INFO) == ["store works again (heartbeat)"]
    failures.failed("heartbeat", StoreUnavailable("database disk full"))
    assert len(_lines(caplog, logging.ERROR)) == 2  # news again


class _FailingStore:
    """A store whose transactions fail with ``causes`` in turn, then answer ``answer``
    (a read: True, something to seal)."""

    def __init__(self, causes: list[str], answer: Any) -> None:
        self.causes, self.answer = list(causes), answer
        self.calls = 0

    async def transact(self, op: Callable[..., Any], *args: Any) -> Any:
        return self._next(write=True)

    async def read(self, op: Callable[..., Any], *args: Any) -> Any:
        return self._next(write=False)

    def _next(self, write: bool) -> Any:
        self.calls += 1
        if self.causes:
            raise StoreUnavailable(self.causes.pop(0))
        if not write:
            return True  # has_unsealed: there is something to seal
        return self.answer


def test_the_seal_loop_logs_a_failing_store_once_and_its_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    store = _FailingStore([f"database is read-only (UPDATE events {i})" for i in range(5)], 1)
    failures = FailureLog(LOG)

    async def main() -> None:
        task = asyncio.create_task(sealer.seal_forever(store, 0.002, failures))  # type: ignore[arg-type]
        while store.calls < 8:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warned] == [
        "store failing: database is read-only (UPDATE events 0) (audit sealing; retrying)"
    ]
    assert _lines(caplog, logging.INFO) == ["store works again (audit sealing)"]


def test_the_webhook_dispatcher_logs_a_failing_store_once_and_its_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "agentledger.service._webhooks")
    # The statement differs from round to round; the cause does not.
    store = _FailingStore([f"database disk full (INSERT INTO webhooks {i})" for i in range(4)], [])
    dispatcher = Dispatcher(store, period=0.002)  # type: ignore[arg-type]

    async def main() -> None:
        stopping = asyncio.Event()
        task = asyncio.create_task(dispatcher.run(stopping))
        while store.calls < 8:
            await asyncio.sleep(0.005)
        stopping.set()
        await task

    asyncio.run(main())
    assert _lines(caplog, logging.WARNING) == [
        "webhook dispatch failing: database disk full (INSERT INTO webhooks 0) (webhooks; retrying)"
    ]
    assert _lines(caplog, logging.INFO) == ["webhook dispatch works again (webhooks)"]
