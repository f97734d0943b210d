"""The store: the one source of truth (:class:`Store`), its operations and dialects."""

from __future__ import annotations

from agentledger._extras import hint
from agentledger.errors import UsageError
from agentledger.store._base import (
    AlreadyDecided,
    Batch,
    EffectClaimed,
    KeyHeld,
    NewEvent,
    NewRun,
    OutboxKeyTaken,
    RunUpdate,
    UnstorableBatch,
    UnstorableValue,
)
from agentledger.store._sqlstore import Store
from agentledger.store._tx import Tx

DEFAULT_URL = "sqlite:///agentledger.db"


def open_store(url: str | None = None) -> Store:
    """Make a (not yet opened) store for a URL: ``sqlite:///file.db`` or ``postgresql://...``.

    >>> store = open_store("sqlite:///runs.db")   # then: await store.open()
    """
    url = url or DEFAULT_URL
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from agentledger.store._postgres import PostgresDialect
        except ImportError as exc:
            raise UsageError(
                hint("postgres", "a postgresql:// database")
                + " ('agentledger[postgres-binary]' where the host has no libpq)"
            ) from exc
        return Store(PostgresDialect(url))
    if url.startswith("sqlite:") or "://" not in url:
        from agentledger.store._sqlite import SQLiteDialect

        return Store(SQLiteDialect(url))
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
    "Store",
    "Tx",
    "UnstorableBatch",
    "UnstorableValue",
    "open_store",
]
