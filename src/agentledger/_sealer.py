"""The audit sealer: chains new events into their tenants' audit chains, in every process
that produces them.

Events are committed unsealed by whoever writes them (the journal's hot path stays free
of a per-tenant chain head); the chain itself is ``agentledger.service``'s, reached
through the kernel's seam (``agentledger/_auditchain.py``), which refuses when the
service was never imported rather than leave records unsealed. A sealer run by each
``serve`` process and each worker seals them shortly after, and a stopping worker seals
once more after its last run is released, so nothing it wrote is left unsealed.
Sealers may run in many processes at once: each tenant's head row lock serializes them
and a record is chained once (``service/_queries/audit.py``). Each signs what it seals under
``AGENTLEDGER_AUDIT_KEY`` (``agentledger/_auditkey.py``), read when it starts.
"""

from __future__ import annotations

import asyncio
import logging
import random

from agentledger import _auditchain as auditchain
from agentledger import _auditkey as auditkey
from agentledger import _envsettings as envsettings
from agentledger._extras import MissingFeature
from agentledger._failures import FailureLog
from agentledger.errors import StoreUnavailable
from agentledger.store import Store

log = logging.getLogger(__name__)

PERIOD_ENV = "AGENTLEDGER_AUDIT_SEAL_EVERY"
BATCH = 500  # records per transaction (a backlog is sealed in several)
MAX_BATCHES = 20  # per round, so one round's backlog cannot hold a process's loop


def period_from_env() -> float:
    """Seconds between seals (env ``AGENTLEDGER_AUDIT_SEAL_EVERY``, default 1; 0.01-3600).

    Raises :class:`UsageError` naming the variable when it is set to anything else."""
    return envsettings.current().audit_seal_every


def key_at_start() -> auditkey.AuditKey | None:
    """The key this process signs seals with (``AGENTLEDGER_AUDIT_KEY``), checked when
    a sealing process starts: an unusable value raises :class:`UsageError` then, not at
    the first seal; none logs a warning, since the chain is then only as trustworthy
    as every writer of the database. A process without the audit chain
    (``agentledger.service`` never imported) raises :class:`MissingFeature` here, before
    it writes anything nobody would seal."""
    auditchain.required("a process that writes audit events", "written")
    key = auditkey.configured()
    if key is None:
        log.warning(
            "%s is not set: audit seals are unsigned and `agentledger audit verify` cannot "
            "tell a chain rewritten by a writer of the database from an intact one",
            auditkey.ENV,
        )
    else:
        log.info("audit seals are signed with key id %s", key.key_id)
    return key


async def seal_once(store: Store, batch: int | None = None, max_batches: int | None = None) -> int:
    """Seal what is committed and unsealed now (up to ``batch * max_batches`` records,
    ``batch`` per transaction; default ``BATCH`` and ``MAX_BATCHES``); return how many
    records were sealed."""
    chain = auditchain.required("sealing the audit chain", "sealed")
    batch = batch or BATCH
    max_batches = max_batches or MAX_BATCHES
    # A read first: an idle process does not take SQLite's write lock every period.
    if not await store.read(chain.has_unsealed):
        return 0
    total = 0
    for _ in range(max_batches):
        sealed = await store.transact(chain.seal, batch)
        total += sealed
        if sealed < batch:
            break
    return total


async def seal_quietly(
    store: Store,
    failures: FailureLog | None = None,
    batch: int | None = None,
    max_batches: int | None = None,
) -> int:
    """:func:`seal_once`, logging instead of raising (the next seal catches up). A store
    that refuses for its own reason (disk full, read-only, connection lost) is told to
    ``failures``, shared with the process's other loops, so it is logged once; a seal
    that wrote tells it the store works again."""
    try:
        sealed = await seal_once(store, batch, max_batches)
    except MissingFeature:
        raise  # no chain to seal into: not a store trouble the next seal gets past
    except Exception as exc:
        if failures is not None and isinstance(exc, StoreUnavailable):
            failures.failed("audit sealing", exc)
        else:
            log.warning("audit sealing failed (%s); retried at the next seal", exc)
        return 0
    if sealed and failures is not None:
        # Only a seal that wrote proves the store takes writes again: an idle round
        # only read, which a full disk or a read-only database still allows.
        failures.recovered("audit sealing")
    return sealed


async def seal_before_exit(
    store: Store, timeout: float = 5.0, failures: FailureLog | None = None
) -> int:
    """A last :func:`seal_quietly`, bounded: a process stopping because its database is
    gone must not hang on it."""
    try:
        return await asyncio.wait_for(seal_quietly(store, failures), timeout)
    except TimeoutError:
        log.warning("audit sealing did not finish within %g s; the next sealer will", timeout)
        return 0


async def seal_forever(
    store: Store,
    period: float,
    failures: FailureLog | None = None,
    batch: int | None = None,
    max_batches: int | None = None,
) -> None:
    """Seal about every ``period`` seconds until cancelled (``failures``, ``batch`` and
    ``max_batches``: see :func:`seal_quietly` and :func:`seal_once`). The one seal loop
    of every process: workers and ``serve``.

    The rounds are jittered (0.5-1.5 periods, the first one too): a seal takes the
    write lock on SQLite, and in phase with the worker's other periodic writes (its
    heartbeats start at the same moment) it would always follow one of them.
    """
    while True:
        await asyncio.sleep(period * random.uniform(0.5, 1.5))
        await seal_quietly(store, failures, batch, max_batches)
