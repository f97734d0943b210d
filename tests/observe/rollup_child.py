"""A process of its own for tests/observe/test_rollup.py.

``finish URL TAG N fold|nofold``: creates N runs and finishes them one by one
(completed or cancelled, with a cost and a duration), with ``fold`` folding two pending
runs after each, as a worker's pass would, racing whoever else finishes and folds on
the same store.

``fold URL STOP_AT``: one fold transaction that announces each statement it has run
(``at K``) and, at statement ``STOP_AT``, waits to be killed before the next one.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from agentledger.store import open_store
from agentledger.store._base import NewRun
from agentledger.store._queries import rollup
from agentledger.store._tx import Tx


async def finish(url: str, tag: str, n: int, folding: bool) -> None:
    store = open_store(url)
    await store.open()
    try:
        for i in range(n):
            run = await store.create_run(NewRun("workflow", f"agent-{tag}", str(i % 2), {}))
            status = "cancelled" if i % 7 == 3 else "completed"
            now = time.time()
            await store.transact(
                lambda tx, r=run.id, s=status, c=now: tx.execute(
                    "UPDATE runs SET status = :s, cost_usd = :cost, tokens = :t, "
                    "updated_at = :u WHERE id = :id",
                    {"s": s, "cost": 0.01 * (i % 5), "t": i, "u": c + 0.05 * i, "id": r},
                )
            )
            if folding:
                await store.transact(rollup.fold_pending, 2)
    finally:
        await store.close()


class Stopping:
    """The transaction, announcing each statement run through it."""

    def __init__(self, tx: Tx, stop_at: int) -> None:
        self._tx = tx
        self._stop_at = stop_at
        self._n = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def _after(self) -> None:
        self._n += 1
        print(f"at {self._n}", flush=True)
        if self._n == self._stop_at:
            sys.stdin.readline()  # killed here, the transaction open

    def execute(self, sql: str, params: Any = None) -> Any:
        got = self._tx.execute(sql, params or {})
        self._after()
        return got

    def fetchall(self, sql: str, params: Any = None) -> Any:
        got = self._tx.fetchall(sql, params or {})
        self._after()
        return got


async def fold(url: str, stop_at: int) -> None:
    store = open_store(url)
    await store.open()
    try:
        folded = await store.transact(lambda tx: rollup.fold_pending(Stopping(tx, stop_at), 5))  # type: ignore[arg-type]
        print(f"done {folded}", flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    if sys.argv[1] == "finish":
        asyncio.run(finish(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "fold"))
    else:
        asyncio.run(fold(sys.argv[2], int(sys.argv[3])))
