"""Model deltas on a run's SSE stream: ``event: model.delta`` frames between its events.

A stream follows the run's deltas (:func:`follow`) next to its journaled events. Deltas
come from the worker in this process (``serve --workers-inline N``) straight through
:mod:`agentledger.gateway._stream`, and on PostgreSQL from workers in other processes
through one LISTEN connection per service process (:class:`DeltaBridge`, opened while
at least one stream follows, on :data:`~agentledger.gateway._stream.DELTA_CHANNEL`).

A delta frame has no ``id:`` line: it is ephemeral (not journaled), so it must not move
the client's Last-Event-ID, and a reconnect resumes exactly after the last journaled
event. A client that drops misses the deltas sent meanwhile and loses nothing: the model
step's final message is in the journal's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from agentledger.gateway import _stream as stream
from agentledger.gateway._relay import parse

#: How long a new stream waits for LISTEN to be in place before it goes on without it.
LISTEN_WAIT = 5.0


def frame(event: dict[str, Any]) -> str:
    """One delta as an SSE frame, without ``id:`` (see the module's docstring)."""
    data = json.dumps(
        {
            "type": event["type"],
            "run_id": event["run_id"],
            "step_no": event["step_no"],
            "attempt": event.get("attempt", 1),
            "text": event["text"],
        },
        ensure_ascii=False,
    )
    return f"event: {stream.DELTA_EVENT}\ndata: {data}\n\n"


class DeltaBridge:
    """One LISTEN connection bringing other processes' deltas into this event loop."""

    def __init__(self, url: str, loop: asyncio.AbstractEventLoop) -> None:
        from agentledger.store._postgres.listen import RunListener

        self.users = 0
        self.loop = loop
        self.listener = RunListener(
            url,
            self._received,
            channel=stream.DELTA_CHANNEL,
            application_name="agentledger-delta-listener",
        )

    def _received(self, payload: str) -> None:  # on the listener's thread
        event = parse(payload)
        if event is not None and stream.listened(event["run_id"]):
            self.loop.call_soon_threadsafe(stream.deliver, event)


_bridges: dict[tuple[str, asyncio.AbstractEventLoop], DeltaBridge] = {}


async def close_bridges() -> None:
    """Stop this loop's bridges (the service is shutting down): a stream whose client
    vanished without its generator being closed must not keep a LISTEN thread alive."""
    loop = asyncio.get_running_loop()
    for key in [k for k in _bridges if k[1] is loop]:
        bridge = _bridges.pop(key)
        await asyncio.to_thread(bridge.listener.stop)


@contextlib.asynccontextmanager
async def _bridged(url: str) -> AsyncIterator[None]:
    """Keep this loop's bridge to ``url`` open while the caller follows a run."""
    loop = asyncio.get_running_loop()
    key = (url, loop)
    bridge = _bridges.get(key)
    if bridge is None:
        bridge = _bridges[key] = DeltaBridge(url, loop)
        bridge.listener.start()
    bridge.users += 1
    try:
        # Wait (bounded) until LISTEN is in place, so the stream's first frame means
        # "deltas from now on reach you"; a database that does not answer only costs them.
        if not bridge.listener.listening:
            await asyncio.to_thread(bridge.listener.wait_listening, LISTEN_WAIT)
        yield
    finally:
        bridge.users -= 1
        if bridge.users == 0 and _bridges.get(key) is bridge:
            del _bridges[key]
            # Told to stop at once, without awaiting: a stream cancelled again while it
            # awaited the join (at shutdown) must not leave the LISTEN thread running.
            # The thread sees the flag within its poll interval and closes its connection.
            bridge.listener.stop(timeout=0)


class DeltaFeed:
    """The deltas of one run for one stream."""

    def __init__(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self.queue = queue

    async def until(self, changed: asyncio.Event, heartbeat: float) -> AsyncIterator[str]:
        """Delta frames as they come, until ``changed`` is set (new journaled events).
        After ``heartbeat`` seconds with nothing to send, a keep-alive comment and return."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + heartbeat
        woken = asyncio.ensure_future(changed.wait())
        try:
            while not changed.is_set():
                left = deadline - loop.time()
                if left <= 0:
                    yield ": keep-alive\n\n"
                    return
                got = asyncio.ensure_future(self.queue.get())
                done, _ = await asyncio.wait(
                    {got, woken}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if got not in done:
                    got.cancel()  # a delta taken meanwhile is still sent, below
                    with contextlib.suppress(asyncio.CancelledError):
                        await got
                if not got.cancelled():
                    yield frame(got.result())
                    deadline = loop.time() + heartbeat
        finally:
            woken.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await woken


@contextlib.asynccontextmanager
async def follow(state: Any, run_id: str) -> AsyncIterator[DeltaFeed]:
    """Follow ``run_id``'s deltas while the context is open (``state``: the app's)."""
    url = getattr(state.store, "url", "")
    bridged = (
        _bridged(url)
        if isinstance(url, str) and url.startswith(("postgresql:", "postgres:"))
        else contextlib.nullcontext()
    )
    async with bridged:
        queue = stream.subscribe(run_id)
        try:
            yield DeltaFeed(queue)
        finally:
            stream.unsubscribe(run_id, queue)
