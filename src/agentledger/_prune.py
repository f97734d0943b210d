"""Retention, driven: ``agentledger prune`` and a worker's ``--prune-every`` schedule
(docs/architecture.md, "Retention"; the SQL and the guarantees are in
``store/_queries/retention.py``).

A tenant's prune is a read-only walk of its chain (how far the prefix of prunable
records reaches), then transactions of :data:`retention.BATCH` records each, so a
worker's journal commit never waits behind a long one: on SQLite the prune holds the
single writer only for one batch at a time, on PostgreSQL it locks the tenant's head
row (sealers skip the tenant meanwhile) and the batch's runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time

from agentledger import _auditchain as auditchain
from agentledger import _auditkey as auditkey
from agentledger._extras import MissingFeature
from agentledger._failures import FailureLog
from agentledger.errors import StoreUnavailable
from agentledger.store import Store
from agentledger.store._queries import retention
from agentledger.store._queries.retention import Policy, Removed
from agentledger.store._tx import Tx

log = logging.getLogger(__name__)

PAUSE = 0.15  # seconds at least between two batches: longer than SQLite's busy-retry sleep


async def prune_tenant(
    store: Store,
    policy: Policy,
    *,
    dry_run: bool = False,
    batch: int = retention.BATCH,
    now: float | None = None,
) -> Removed:
    """Prune one tenant's finished runs and the front of its audit chain under
    ``policy``; with ``dry_run``, say what would go and change nothing."""
    cutoff = (time.time() if now is None else now) - policy.older_than
    key = auditkey.configured()
    t = policy.tenant_id
    start = await store.read(retention.pruned_through, t)
    walk = retention.Walk(start)
    after = start
    while not walk.done:
        # Each page in a read of its own: no snapshot held across the walk.
        page = await store.read(functools.partial(_plan, policy, cutoff, after, batch))
        walk.feed(page)
        if len(page) < batch:
            break
        after = page[-1].chain_no
    total = Removed(t, rows={})
    if walk.end <= start:
        return total
    if dry_run:
        # The batches, computed from the walk's end without writing (one read each).
        at = start
        while at < walk.end:
            got = await store.read(
                functools.partial(_dry_batch, policy, cutoff, at, walk.end, key, batch)
            )
            _add(total, got)
            if got.records == 0 or got.stopped:
                break
            at += got.records
        return total
    while True:
        began = time.monotonic()
        got = await store.transact(_locked_batch, policy, cutoff, walk.end, key, batch)
        _add(total, got)
        if got.records == 0 or got.stopped:
            break
        # A pause as long as the batch took, and at least PAUSE: batches back to back
        # starve other writers -- SQLite's busy handler sleeps between tries, longer
        # than a gap between two batches, and finds the lock taken again each time --
        # so a prune holds the writer at most half the time.
        await asyncio.sleep(max(PAUSE, time.monotonic() - began))
    return total


def _plan(policy: Policy, cutoff: float, after: int, batch: int, tx: Tx) -> list[retention.Link]:
    return retention.plan(tx, policy, cutoff, after, batch)


def _dry_batch(
    policy: Policy, cutoff: float, at: int, end: int, key: auditkey.AuditKey | None,
    batch: int, tx: Tx,
) -> Removed:  # fmt: skip
    return retention.prune_batch(tx, policy, cutoff, end, key, batch, dry=True, after=at)


def _locked_batch(
    tx: Tx, policy: Policy, cutoff: float, end: int,
    key: auditkey.AuditKey | None, batch: int,
) -> Removed:  # fmt: skip
    return retention.prune_batch(tx, policy, cutoff, end, key, batch)


def _add(total: Removed, got: Removed) -> None:
    total.records += got.records
    total.runs += got.runs
    for table, n in got.rows.items():
        total.rows[table] = total.rows.get(table, 0) + n
    total.stopped = got.stopped or total.stopped
    total.broken = got.broken or total.broken


async def prune_forever(store: Store, period: float, failures: FailureLog | None = None) -> None:
    """A worker's ``--prune-every``: every ``period`` seconds (jittered), prune each
    tenant with a configured retention -- in the one worker whose claim of the round
    lands (``retention.claim_round``): the others skip it. Without the audit chain it
    raises :class:`MissingFeature` at once: a round it claimed could not prune, and the
    workers that can would skip it."""
    auditchain.required("a worker's --prune-every", "claimed or removed")
    while True:
        await asyncio.sleep(period * random.uniform(0.5, 1.5))
        try:
            if not await store.transact(retention.claim_round, period):
                continue
            for policy in await store.read(retention.policies):
                try:
                    removed = await prune_tenant(store, policy)
                except (StoreUnavailable, MissingFeature):
                    raise
                except Exception as exc:
                    # One tenant's prune failing for its own reason is retried next
                    # round; it stops neither the others nor the worker.
                    log.warning("prune of tenant %s failed (%s); tried again next round",
                                policy.tenant_id, exc)  # fmt: skip
                    continue
                if removed.records:
                    log.info(
                        "pruned tenant %s: %d runs, %d audit records summarized",
                        removed.tenant_id, removed.runs, removed.records,
                    )  # fmt: skip
                if removed.stopped:
                    log.warning("prune of tenant %s stopped: %s", removed.tenant_id,
                                removed.stopped)  # fmt: skip
        except StoreUnavailable as exc:
            if failures is not None:
                failures.failed("prune", exc)
