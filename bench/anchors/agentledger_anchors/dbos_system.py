"""DBOS Transact: the workloads as ``@DBOS.workflow`` functions of ``@DBOS.step`` calls.

Configuration (DBOS's documented defaults, the fast ones where there is a choice):
the system database is the store (``system_database_url``: a SQLite file or a
PostgreSQL database); every step's output is written to ``operation_outputs`` in its
own transaction when the step returns. Sequential runs are synchronous workflows
(a step is a plain function call in the workflow's thread); the concurrent runs are
either synchronous workflows started with ``DBOS.start_workflow`` (a thread each) or
``async`` workflows started with ``DBOS.start_workflow_async`` on one event loop; the
faster is reported. SQLite: DBOS opens the file in SQLite's default rollback-journal
mode (``variant="default"``); ``variant="wal"`` makes the file WAL first (the journal
mode persists in the file), as agentledger and LangGraph use it.

A DBOS step writes one record, after the call: there is no record of a call that
started, so a write in flight at a crash runs again on recovery; the write step is
measured as the same ``@DBOS.step`` with a write in it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

from dbos import DBOS

from agentledger_anchors.common import Clock, message
from agentledger_anchors.ticks import TICKS, tick

NAME = "DBOS Transact"


@DBOS.step()
def read_step(i: int) -> int:
    return i


@DBOS.step()
def write_step(i: int) -> int:
    return i


@DBOS.step()
def payload_step(i: int, size: int) -> str:
    return message(i, size)


@DBOS.step()
def tick_step(path: str, i: int) -> int:
    return tick(path, i)


@DBOS.step()
async def read_step_async(i: int) -> int:
    return i


@DBOS.workflow()
def steps_workflow(kind: str, n: int) -> dict[str, Any]:
    step = read_step if kind == "read" else write_step
    clock = Clock()
    for i in range(n):
        step(i)
    return clock.done(n)


@DBOS.workflow()
async def steps_workflow_async(n: int) -> dict[str, Any]:
    clock = Clock()
    for i in range(n):
        await read_step_async(i)
    return clock.done(n)


@DBOS.workflow()
def payload_workflow(n: int, size: int) -> int:
    for i in range(n):
        payload_step(i, size)
    return n


@DBOS.workflow()
def ticks_workflow(path: str) -> int:
    for i in range(TICKS):
        tick_step(path, i)
    return TICKS


class System:
    name = NAME
    bytes_schema = ("dbos", "workflow_uuid")

    def __init__(self, store: str, target: str, variant: str = "default") -> None:
        self.store, self.variant = store, variant
        if store == "sqlite":
            if variant == "wal" and not Path(target).exists():
                conn = sqlite3.connect(target)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.close()
            url = f"sqlite:///{target}"
        else:
            url = target
        logging.getLogger("dbos").setLevel(logging.WARNING)
        DBOS(config={"name": "anchors", "system_database_url": url, "log_level": "WARNING"})
        DBOS.launch()

    def close(self) -> None:
        DBOS.destroy(destroy_registry=False)

    def config(self) -> str:
        if self.store == "sqlite":
            mode = "WAL" if self.variant == "wal" else "rollback journal (DBOS's default)"
            return f"system database on SQLite, {mode}, synchronous=FULL"
        return "system database on PostgreSQL"

    def seq(self, kind: str, steps: int) -> dict[str, Any]:
        result: dict[str, Any] = steps_workflow(kind, steps)
        return result

    def concurrent(self, runs: int, steps: int, mode: str) -> list[dict[str, Any]]:
        if mode == "threads":
            handles = [DBOS.start_workflow(steps_workflow, "read", steps) for _ in range(runs)]
            return [h.get_result() for h in handles]

        async def main() -> list[dict[str, Any]]:
            handles = [
                await DBOS.start_workflow_async(steps_workflow_async, steps) for _ in range(runs)
            ]
            return list(await asyncio.gather(*(h.get_result() for h in handles)))

        return asyncio.run(main())

    concurrency_modes = ("threads", "asyncio")

    def payload_run(self, n: int, size: int) -> str:
        handle = DBOS.start_workflow(payload_workflow, n, size)
        handle.get_result()
        return str(handle.get_workflow_id())

    def start_ticks(self, run_key: str, path: str) -> None:
        from dbos import SetWorkflowID

        with SetWorkflowID(run_key):
            ticks_workflow(path)

    def resume_ticks(self, run_key: str, path: str) -> None:
        """``DBOS.launch()`` in a new process recovers this executor's pending workflows."""
        DBOS.retrieve_workflow(run_key).get_result()
