"""Stores: the one source of truth, behind one interface (:class:`Store`)."""

from __future__ import annotations

from agentledger.errors import UsageError
from agentledger.extras import hint
from agentledger.store.base import (
    AlreadyDecided,
    Batch,
    EffectClaimed,
    KeyHeld,
    NewEvent,
    NewRun,
    OutboxKeyTaken,
    RunUpdate,
    Store,
    UnstorableBatch,
    UnstorableValue,
)
from agentledger.store.sqlstore import SQLStore

DEFAULT_URL = "sqlite:///agentledger.db"


def open_store(url: str | None = None) -> SQLStore:
    """Make a (not yet opened) store for a URL: ``sqlite:///file.db`` or ``postgresql://...``.

    >>> store = open_store("sqlite:///runs.db")   # then: await store.open()
    """
    url = url or DEFAULT_URL
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from agentledger.store.postgres import PostgresDialect
        except ImportError as exc:
            raise UsageError(
                hint("postgres", "a postgresql:// database")
                + " ('agentledger[postgres-binary]' where the host has no libpq)"
            ) from exc
        return SQLStore(PostgresDialect(url))
    if url.startswith("sqlite:") or "://" not in url:
        from agentledger.store.sqlite import SQLiteDialect

        return SQLStore(SQLiteDialect(url))
    scheme = url.split("://", 1)[0]
    raise UsageError(
        f"unsupported database URL scheme {scheme!r}; use sqlite:///file.db or postgresql://..."
    )


__all__ = [
    "DEFAULT_URL",
    "AlreadyDecided",
    "Batch",
    "EffectClaimed",
    "KeyHeld",
    "NewEvent",
    "NewRun",
    "OutboxKeyTaken",
    "RunUpdate",
    "SQLStore",
    "Store",
    "UnstorableBatch",
    "UnstorableValue",
    "open_store",
]
