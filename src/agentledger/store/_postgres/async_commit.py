"""PostgreSQL: plain journal batches committed from the event loop itself.

Every other store job runs on the writer thread; the journal batches that fit
in one statement (see :mod:`agentledger.store._postgres.batches`) go through an
``AsyncConnection`` instead, which spares each step two thread hand-offs. While
one group is on the wire the next accumulates, so concurrent runs still share
commits (group commit). A group of one is a single autocommitted statement (one
round trip); a larger group is BEGIN, its statements and COMMIT in one pipeline.
Callers are answered only after the commit returned. Each committed group pokes the
events notifier (:mod:`agentledger.store._postgres.notifier`), which announces it from a
connection of its own: a journal commit never notifies inside its own transaction.

A lost connection is re-opened with backoff for up to a minute and the group is
sent again. Its COMMIT may have committed with the reply lost, so before sending
again the committer reads back each batch's token (written by the fence on the run
row): a batch found committed is answered as committed, never applied twice (its
audit events doubled) nor answered "lease lost" because its own status change
fenced it out.

A group the server refuses for another reason (one batch's value) falls back to
one statement per batch, so the innocent batches commit and the poisoned one fails
alone with its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, MutableSequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from agentledger.errors import LeaseLost
from agentledger.store._base import Batch
from agentledger.store._groupcommit import resolve_future
from agentledger.store._postgres.batches import batch_statement, is_plain
from agentledger.store._postgres.connection import SESSION_SETUP, keep_farewell, lost_cause
from agentledger.store._postgres.notifier import EventsNotifier
from agentledger.store._retrying import Reconnect

log = logging.getLogger(__name__)


class AsyncBatchCommitter:
    """Group commit of plain batches on the caller's event loop (a
    :class:`~agentledger.store._groupcommit.JournalCommitter`)."""

    def __init__(
        self,
        connect: Callable[[], Any],
        is_disconnect: Callable[[BaseException], bool],
        translate: Callable[[BaseException], BaseException],
        sizes: MutableSequence[int],
        is_transient: Callable[[BaseException], bool] = lambda exc: False,
    ) -> None:
        self._connect = connect
        self._is_disconnect = is_disconnect
        self._is_transient = is_transient
        self._translate = translate
        self._sizes = sizes
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._pending: list[tuple[Batch, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._notifier = EventsNotifier(connect)

    async def open(self) -> None:
        self._conn = await self._connect()

    def accepts(self, batch: Batch) -> bool:
        return is_plain(batch)

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        await self._notifier.close()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    async def commit(self, batch: Batch) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((batch, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="agentledger-pg-commit")
        await future

    async def _drain(self) -> None:
        while self._pending:
            group, self._pending = self._pending, []
            await self._commit_group(group)
            self._notifier.poke()  # after the commit: a listener's read finds the events

    async def _commit_group(self, group: list[tuple[Batch, asyncio.Future[None]]]) -> None:
        group.sort(key=lambda item: item[0].run_id)  # row locks in run-id order
        retry = Reconnect()
        retried = any(b.resent for b, _ in group)  # Batch.resent: look first
        while True:
            try:
                if retried:
                    group = await self._settle_committed(group)
                    if not group:
                        return
                outcomes = await self._apply([b for b, _ in group])
                break
            except Exception as exc:
                if self._is_transient(exc) and retry.may_retry_transient():
                    # A deadlock or serialization failure: rolled back, try again.
                    await asyncio.sleep(retry.transient_pause())
                    continue
                if not self._is_disconnect(exc):
                    if len(group) > 1:
                        await self._one_by_one(group)  # the poisoned batch fails alone
                        return
                    resolve_future(group[0][1], None, self._translate(exc))
                    return
                if not retry.within_window():
                    error = self._translate(exc)
                    for _, future in group:
                        resolve_future(future, None, error)
                    return
                log.warning(
                    "journal connection lost (%s); reconnecting", lost_cause(self._conn, exc)
                )
                retried = True  # the COMMIT may have committed: look before resending
                await asyncio.sleep(retry.next_pause())
                await self._reconnect()
        self._sizes.append(len(group))
        for (_, future), refused in zip(group, outcomes, strict=True):
            resolve_future(future, None, refused)

    async def _one_by_one(self, group: list[tuple[Batch, asyncio.Future[None]]]) -> None:
        for item in group:
            await self._commit_group([item])

    async def _settle_committed(
        self, group: list[tuple[Batch, asyncio.Future[None]]]
    ) -> list[tuple[Batch, asyncio.Future[None]]]:
        """Answer the batches that committed before the connection was lost; return the
        rest. (In a committed group the fenced-out batches wrote nothing: resending them
        is refused again, exactly as the first time.)"""
        conn = self._conn
        if conn is None or conn.closed:
            raise psycopg.InterfaceError("the journal connection is closed")
        cursor = await conn.execute(
            "SELECT write_token FROM runs WHERE id = ANY(%s)", ([b.run_id for b, _ in group],)
        )
        tokens = {row["write_token"] for row in await cursor.fetchall()}
        rest = []
        for batch, future in group:
            if batch.token in tokens:
                resolve_future(future, None, None)
            else:
                rest.append((batch, future))
        return rest

    async def _reconnect(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
        try:
            self._conn = await self._connect()
        except Exception as exc:
            log.warning("journal reconnect failed: %s", exc)

    async def _apply(self, batches: list[Batch]) -> list[LeaseLost | None]:
        conn = self._conn
        if conn is None or conn.closed:
            raise psycopg.InterfaceError("the journal connection is closed")
        statements = [batch_statement(b) for b in batches]
        if len(statements) == 1:
            cursors = [await conn.execute(*statements[0])]
        else:
            try:
                async with conn.pipeline():
                    await conn.execute("BEGIN")
                    cursors = [await conn.execute(*s) for s in statements]
                    await conn.execute("COMMIT")
            except Exception:
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                raise
        outcomes: list[LeaseLost | None] = []
        for batch, cursor in zip(batches, cursors, strict=True):
            row = await cursor.fetchone()
            fenced = int(row["fenced"]) if row else 0
            batch.cancel_requested = row.get("cancel_requested") if row else None
            outcomes.append(None if fenced else LeaseLost(batch.run_id, batch.epoch))
        return outcomes


async def connect_async(url: str, settings: dict[str, Any]) -> psycopg.AsyncConnection[Any]:
    """An autocommit AsyncConnection with the same session settings as the store's."""
    conn: psycopg.AsyncConnection[Any] = await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row, **settings
    )
    keep_farewell(conn)
    await conn.execute(SESSION_SETUP)
    return conn
