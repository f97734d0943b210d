"""The daily rollup under interleavings that could count a run twice or not at all
(store/_queries/rollup.py): a resume racing a fold on PostgreSQL, where the two
transactions overlap (on SQLite a write transaction holds the file's lock from its
start, so they cannot)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from agentledger import _rollup
from agentledger.observe._queries.resume import resume_run
from agentledger.store import Store, open_store
from agentledger.store._queries import rollup
from agentledger.store._tx import Tx
from agentledger.worker import Worker, WorkerConfig
from tests.observe.test_rollup import _check, _direct, _sql, keyed  # noqa: F401
from tests.service import service_app
from tests.store.test_prune import _finished


async def _waits_on_a_lock(store: Store) -> bool:
    found = await store.read(
        lambda tx: tx.fetchall(
            "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
    )
    return int(found[0]["n"]) > 0


async def test_a_resume_waiting_on_a_fold_of_its_run_takes_it_back_out(
    keyed: None,  # noqa: F811
    pg_url: str,
) -> None:
    store, folder = open_store(pg_url), open_store(pg_url)
    await store.open()
    await folder.open()
    holding, go = threading.Event(), threading.Event()
    try:
        ids = await _finished(store, "t1", 3, steps=2)
        await _sql(store, "UPDATE runs SET status = 'failed' WHERE id = :id", {"id": ids[0]})

        def fold_and_hold(tx: Tx) -> int:
            # A fold that has flipped its runs and not committed yet (a large batch).
            n = rollup.fold_pending(tx)
            holding.set()
            go.wait(60)
            return n

        fold = asyncio.create_task(folder.transact(fold_and_hold))
        assert await asyncio.to_thread(holding.wait, 60)
        resume = asyncio.create_task(store.transact(resume_run, ids[0], 1, "ops", "retry"))
        while not await _waits_on_a_lock(store):  # the resume waits on the run's row
            assert not resume.done(), resume.exception()
            await asyncio.sleep(0.01)
        go.set()
        assert await fold == 3
        await resume
        got: list[dict[str, Any]] = await _sql(
            store, "SELECT status, rolled FROM runs WHERE id = :id", {"id": ids[0]}
        )
        assert [(r["status"], int(r["rolled"])) for r in got] == [("queued", 0)]
        await Worker(store, service_app.app, WorkerConfig(poll_seconds=0.02), burst=True).run(
            install_signals=False
        )
        await _rollup.fold_once(store, max_batches=None)
        await _check(store, None, await _direct(store, None))
    finally:
        go.set()  # a failure above does not leave the fold holding its rows
        await folder.close()
        await store.close()
