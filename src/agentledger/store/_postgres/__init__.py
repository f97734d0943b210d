"""The PostgreSQL backend: many stateless workers on many hosts.

``connection`` (the leaf: sessions, placeholders, errors) <- ``batches`` (a journal batch
as one statement) <- ``async_commit`` (groups of batches from the event loop), ``listen``
(LISTEN/NOTIFY wake-ups) <- ``dialect`` (the store's hooks).
"""

from agentledger.store._postgres.connection import RUNS_CHANNEL, connect, convert_placeholders
from agentledger.store._postgres.dialect import PostgresDialect

__all__ = ["RUNS_CHANNEL", "PostgresDialect", "connect", "convert_placeholders"]
