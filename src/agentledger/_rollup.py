"""The rollup's background pass: fold finished runs and delivered outbox rows into the
daily rollup (store/_queries/rollup.py), in every worker.

Readers of the rollup add what is not folded yet, so the figures are exact whenever
this runs; folding keeps what they read live small. Any number of workers may fold at
once: a run is folded by whichever transaction flips it first, once.
"""

from __future__ import annotations

import asyncio
import logging
import random

from agentledger._failures import FailureLog
from agentledger.errors import StoreUnavailable
from agentledger.store import Store
from agentledger.store._queries import rollup

log = logging.getLogger(__name__)

PERIOD = 30.0  # seconds between a worker's folds (jittered)
MAX_BATCHES = 20  # fold transactions per round, so a backlog cannot hold the loop


async def fold_once(
    store: Store, batch: int = rollup.BATCH, max_batches: int | None = MAX_BATCHES
) -> int:
    """Fold what is pending now, ``batch`` runs (and outbox rows) per transaction, at
    most ``max_batches`` transactions (None: until nothing is left); how many folded."""
    # A read first: an idle process does not take SQLite's write lock every period.
    if not await store.read(rollup.has_pending):
        return 0
    total = 0
    rounds = 0
    while max_batches is None or rounds < max_batches:
        folded = await store.transact(rollup.fold_pending, batch)
        total += folded
        rounds += 1
        if folded == 0:
            break
    return total


async def fold_forever(
    store: Store, period: float = PERIOD, failures: FailureLog | None = None
) -> None:
    """:func:`fold_once` about every ``period`` seconds until cancelled; a store that
    refuses is told to ``failures`` and tried again next round."""
    while True:
        await asyncio.sleep(period * random.uniform(0.5, 1.5))
        try:
            await fold_once(store)
        except StoreUnavailable as exc:
            if failures is not None:
                failures.failed("rollup", exc)
        except Exception as exc:  # the next round tries again; readers stay exact
            log.warning("folding the rollup failed (%s); tried again next round", exc)
