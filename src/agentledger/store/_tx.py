"""The unit of work: one open transaction of the store, typed.

Every store operation is a plain function whose first parameter is a :class:`Tx`::

    def get_run(tx: Tx, run_id: str) -> Run | None:
        rows = tx.fetchall("SELECT ... FROM runs WHERE id = :id", {"id": run_id})
        ...

and runs in one transaction through the store: ``await store.transact(get_run, run_id)``
(a write transaction) or ``await store.read(get_run, run_id)`` (read-only, on a read
connection). The store begins, commits or rolls back, and retries after a lost
connection; the operation only issues statements. SQL is written once with ``:name``
placeholders; :attr:`Tx.dialect` holds what differs between databases.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentledger.store._dialect import Dialect

__all__ = ["Tx"]


class Tx:
    """One open transaction on one connection of one dialect.

    ``execute`` and ``fetchall`` are bound once per transaction (not looked up per
    statement): a journal batch issues a dozen statements, on the step's hot path.
    """

    __slots__ = ("conn", "dialect", "execute", "executemany", "fetchall", "now")

    dialect: Dialect
    #: The driver connection, for the dialect's own hooks (``dialect.notify_runnable``).
    conn: Any
    #: The database's clock as UNIX seconds, in SQL (``dialect.now_sql``): leases and
    #: due times are judged by it, never by the calling process's clock.
    now: str
    #: Run one statement; return the number of rows it changed.
    execute: Callable[..., int]
    #: Run one statement and return its rows as dicts.
    fetchall: Callable[..., list[dict[str, Any]]]
    #: Run one statement once per parameter set; return the rows changed in all.
    executemany: Callable[..., int]

    def __init__(self, dialect: Dialect, conn: Any) -> None:
        self.dialect = dialect
        self.conn = conn
        self.now = dialect.now_sql
        self.execute = functools.partial(dialect.execute, conn)
        self.fetchall = functools.partial(dialect.fetchall, conn)
        self.executemany = functools.partial(dialect.executemany, conn)

    def __repr__(self) -> str:
        return f"Tx({self.dialect.name})"
