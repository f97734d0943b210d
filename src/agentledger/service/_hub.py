"""Wake-ups for streams and long polls: ONE poll of the watched runs' heads per tick.

Each waiter holds an :class:`asyncio.Event`; the hub reads (last event seq, status) of
every watched run in one query and sets the events of the runs that moved. A waiter
clears its event *before* reading the database, so a change is never missed between
its read and its wait.

The heads the hub read are kept (:meth:`EventHub.head`): a stream woken by the hub reads
the head from there instead of asking the database again -- with 100 open streams that
is 100 queries fewer per change, all on the store's one connection. A kept head is
never newer than the database, and the hub wakes the waiters whenever it moves, so a
stream that reads a kept head misses nothing: it is woken again by the next poll.

A tenant is watched the same way (:meth:`EventHub.watch_tenant`, the runs list): its
head is the last position of its audit chain (``audit_heads.chain_no``), which moves
when the sealer chains the tenant's new events, so one primary-key read per watched
tenant and poll tells whether anything of the tenant happened.

A poll runs every ``period`` seconds, and at once (at most every ``MIN_GAP``) when
:meth:`EventHub.poke` says events were committed: the store calls it after each journal
commit of this process (``serve --workers-inline``), and on PostgreSQL every journal
group commit notifies a channel the hub listens on (other processes' workers). A poke
only starts a poll -- what a stream sends still comes from the database by ``seq`` --
so a lost notification costs one poll period, never an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from agentledger.service._queries import events as service_events
from agentledger.store import Store

log = logging.getLogger(__name__)

_CHUNK = 500  # runs per poll query
MIN_GAP = 0.005  # seconds between polls started by pokes: a burst of commits, one poll
_RUN, _TENANT = "run", "tenant"
_Key = tuple[str, str]  # (kind, id)


class EventHub:
    """Polls the heads of watched runs and wakes their waiters."""

    def __init__(self, store: Store, period: float) -> None:
        self.store = store
        self.period = period
        # Keyed by (kind, id): a run id and a tenant id may be the same text.
        self._waiters: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._heads: dict[tuple[str, str], tuple[int, str]] = {}
        self._wake = asyncio.Event()
        self._poked = asyncio.Event()
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop_ref = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._loop(), name="event-hub")

    def poke(self) -> None:
        """Events were committed: poll now rather than at the end of the period."""
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is self._loop_ref:
            self._poked.set()
        else:  # a commit on another loop or thread
            self.poke_threadsafe()

    def poke_threadsafe(self) -> None:
        """:meth:`poke` from another thread (a database notification listener)."""
        loop = self._loop_ref
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._poked.set)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @contextlib.asynccontextmanager
    async def watch(self, run_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever ``run_id`` gets a new event or status."""
        async with self._watch((_RUN, run_id)) as event:
            yield event

    @contextlib.asynccontextmanager
    async def watch_tenant(self, tenant_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever the tenant's audit chain grows (its events sealed)."""
        async with self._watch((_TENANT, tenant_id)) as event:
            yield event

    @contextlib.asynccontextmanager
    async def _watch(self, key: tuple[str, str]) -> AsyncIterator[asyncio.Event]:
        event = asyncio.Event()
        self._waiters.setdefault(key, set()).add(event)
        self._wake.set()
        try:
            yield event
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]
                    self._heads.pop(key, None)

    def head(self, run_id: str) -> tuple[int, str] | None:
        """(last event seq, status) of a watched run as the last poll read it; None
        before the first poll that saw it."""
        return self._heads.get((_RUN, run_id))

    def tenant_head(self, tenant_id: str) -> int | None:
        """The last chain position of a watched tenant as the last poll read it."""
        head = self._heads.get((_TENANT, tenant_id))
        return None if head is None else head[0]

    async def _heads_of(self, keys: list[_Key]) -> dict[_Key, tuple[int, str]]:
        runs = [i for kind, i in keys if kind == _RUN]
        tenants = [i for kind, i in keys if kind == _TENANT]
        out: dict[tuple[str, str], tuple[int, str]] = {}
        if runs:
            found = await self.store.read(service_events.event_heads, runs)
            out.update(((_RUN, i), head) for i, head in found.items())
        if tenants:
            chains = await self.store.read(service_events.tenant_heads, tenants)
            # A tenant with nothing sealed yet is at position 0.
            out.update(((_TENANT, t), (chains.get(t, 0), "")) for t in tenants)
        return out

    async def _loop(self) -> None:
        while True:
            if not self._waiters:
                self._wake.clear()
                await self._wake.wait()
            ids = list(self._waiters)
            heads: dict[tuple[str, str], tuple[int, str]] = {}
            # In chunks: one query naming every watched run would pass the database's
            # limit of bound parameters under a reconnect storm and blind every stream.
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                try:
                    heads.update(await self._heads_of(chunk))
                except Exception as exc:  # a store hiccup must not end every stream
                    log.warning("event hub poll failed: %s", exc)
            for key, head in heads.items():
                if self._heads.get(key) != head:
                    self._heads[key] = head
                    for event in self._waiters.get(key, ()):
                        event.set()
            await self._pause()

    async def _pause(self) -> None:
        """Until the next poll: the period, or a poke (after at least ``MIN_GAP``)."""
        await asyncio.sleep(min(MIN_GAP, self.period))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._poked.wait(), max(0.0, self.period - MIN_GAP))
        # Cleared only now, before the poll: a commit poked during the poll above or the
        # pause is seen by the poll that follows.
        self._poked.clear()
