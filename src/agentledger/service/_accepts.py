"""Group commit of accepted runs: concurrent submits share one transaction.

Each ``POST /v1/runs`` hands its submit to the :class:`AcceptBatcher`; while one group
commits, the next fills up, so under load many accepts cost one fsync. Nothing is
acknowledged before the transaction holding it committed. Every group, of one submit or
many, is decided and written by :func:`agentledger.service._accepting.accept`; a submit
refused inside a group (quota, a reused Idempotency-Key) fails alone under its savepoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from agentledger.service import _accepting as accepting
from agentledger.service._accepting import (
    IdempotencyMismatch,
    QuotaExceeded,
    SubmitRequest,
    Submitted,
)
from agentledger.store import Store

log = logging.getLogger(__name__)

_MAX_GROUP = 256


class AcceptBatcher:
    """Collects submits and commits them in groups."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._queue: asyncio.Queue[tuple[SubmitRequest, asyncio.Future[Submitted]]] = (
            asyncio.Queue()
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="accept-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def submit(self, request: SubmitRequest) -> Submitted:
        """Commit ``request`` with whatever else is waiting; raise its own refusal
        (:class:`IdempotencyMismatch`, :class:`QuotaExceeded`) or error.

        A submit that failed otherwise -- its group failed whole, or another process
        committed its Idempotency-Key between the group's read and its insert (a unique
        violation) -- is accepted once more alone, reading afresh: the other process's
        key is then replayed. Safe to repeat: the request id makes a committed submit
        answer itself."""
        try:
            return await self._grouped(request)
        except (IdempotencyMismatch, QuotaExceeded):
            raise
        except Exception:
            pass
        outcome = (await self.store.transact(accepting.accept, [request]))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _grouped(self, request: SubmitRequest) -> Submitted:
        future: asyncio.Future[Submitted] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((request, future))
        return await future

    async def _loop(self) -> None:
        while True:
            group = [await self._queue.get()]
            while len(group) < _MAX_GROUP and not self._queue.empty():
                group.append(self._queue.get_nowait())
            live = [(r, f) for r, f in group if not f.done()]
            if not live:
                continue
            requests = [r for r, _ in live]
            try:
                outcomes = await self.store.transact(accepting.accept, requests)
            except Exception as exc:  # the whole group failed: every caller sees it
                for _, future in live:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), outcome in zip(live, outcomes, strict=True):
                if future.done():
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
