"""LangGraph: the workloads on its own checkpointers (SQLite and PostgreSQL).

Two shapes of the same run, the faster is reported:

* ``functional``: the Functional API, an ``@entrypoint`` calling an ``@task`` per step;
  each task's result is saved as a checkpoint write of the run's thread.
* ``graph``: a ``StateGraph`` whose one node loops back to itself; each pass is a
  superstep with a checkpoint of its own.

Every run uses ``durability="sync"``: a step is saved before the next one starts, as
agentledger and DBOS save it (LangGraph's default ``"async"`` saves it while the next
step runs, so a crash can lose it; it is measured too, as ``functional-async``).
Checkpointers, configured as their documentation shows them: ``SqliteSaver`` /
``AsyncSqliteSaver`` (they set WAL; SQLite's default ``synchronous=FULL``),
``PostgresSaver`` on one autocommit connection and ``AsyncPostgresSaver`` on an
``AsyncConnectionPool`` of 20 for the concurrent runs. Concurrent runs are ``ainvoke``
calls gathered on one event loop.

LangGraph has no worker, lease or recovery of its own: a run whose process died is
resumed only when the application invokes its thread again (``invoke(None, config)``),
which is what the restart case measures; no other process notices it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Durability

from agentledger_anchors.common import Clock, message
from agentledger_anchors.ticks import TICKS, tick

NAME = "LangGraph"
POOL_SIZE = 20


@task
def read_task(i: int) -> int:
    return i


@task
def write_task(i: int) -> int:
    return i


@task
def payload_task(i: int, size: int) -> str:
    return message(i, size)


@task
def tick_task(path: str, i: int) -> int:
    return tick(path, i)


@task
async def read_task_async(i: int) -> int:
    return i


def _steps(inp: dict[str, Any]) -> dict[str, Any]:
    step = read_task if inp["kind"] == "read" else write_task
    clock = Clock()
    for i in range(inp["n"]):
        step(i).result()
    return clock.done(inp["n"])


async def _steps_async(inp: dict[str, Any]) -> dict[str, Any]:
    clock = Clock()
    for i in range(inp["n"]):
        await read_task_async(i)
    return clock.done(inp["n"])


def _payload(inp: dict[str, Any]) -> int:
    for i in range(inp["n"]):
        payload_task(i, inp["size"]).result()
    return int(inp["n"])


def _ticks(inp: dict[str, Any]) -> int:
    for i in range(TICKS):
        tick_task(inp["path"], i).result()
    return TICKS


class LoopState(TypedDict, total=False):
    i: int
    n: int
    size: int
    out: Any


def _loop_graph(saver: Any, node: Any) -> Any:
    builder = StateGraph(LoopState)
    builder.add_node("step", node)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["i"] < s["n"] else END)
    return builder.compile(checkpointer=saver)


def _loop_step(state: LoopState) -> LoopState:
    return {"i": state["i"] + 1, "out": state["i"]}


def _loop_payload(state: LoopState) -> LoopState:
    return {"i": state["i"] + 1, "out": message(state["i"], state["size"])}


async def _aloop_step(state: LoopState) -> LoopState:
    return {"i": state["i"] + 1, "out": state["i"]}


def _thread(key: str, n: int = 0) -> RunnableConfig:
    return {"configurable": {"thread_id": key}, "recursion_limit": n + 100}


class System:
    name = NAME
    bytes_schema = ("public", "thread_id")
    concurrency_modes = ("asyncio",)

    def __init__(self, store: str, target: str, variant: str = "functional") -> None:
        self.store, self.target, self.variant = store, target, variant
        self.durability: Durability = "async" if variant.endswith("-async") else "sync"
        if store == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            self.conn: Any = sqlite3.connect(target, check_same_thread=False)
            self.saver: Any = SqliteSaver(self.conn)
        else:
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg import Connection
            from psycopg.rows import dict_row

            self.conn = Connection.connect(
                target, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
            self.saver = PostgresSaver(self.conn)
        self.saver.setup()
        self.counter = 0

    def close(self) -> None:
        self.conn.close()

    def config(self) -> str:
        shape = "StateGraph loop" if self.variant == "graph" else "Functional API"
        saver = "SqliteSaver (WAL)" if self.store == "sqlite" else "PostgresSaver"
        return f"{shape}, {saver}, durability={self.durability}"

    def _key(self) -> str:
        self.counter += 1
        return f"{time.time_ns()}-{self.counter}"

    def seq(self, kind: str, steps: int) -> dict[str, Any]:
        if self.variant == "graph":
            graph = _loop_graph(self.saver, _loop_step)
            clock = Clock()
            graph.invoke({"i": 0, "n": steps}, _thread(self._key(), steps), durability="sync")
            return clock.done(steps)
        run = entrypoint(checkpointer=self.saver)(_steps)
        result: dict[str, Any] = run.invoke(
            {"kind": kind, "n": steps}, _thread(self._key()), durability=self.durability
        )
        return result

    def concurrent(self, runs: int, steps: int, mode: str) -> list[dict[str, Any]]:
        return asyncio.run(self._concurrent(runs, steps))

    async def _concurrent(self, runs: int, steps: int) -> list[dict[str, Any]]:
        if self.store == "sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with aiosqlite.connect(self.target) as conn:
                saver: Any = AsyncSqliteSaver(conn)
                await saver.setup()
                return await self._gather(saver, runs, steps)
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
        async with AsyncConnectionPool(
            self.target, max_size=POOL_SIZE, kwargs=kwargs, open=False
        ) as pool:
            saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
            return await self._gather(saver, runs, steps)

    async def _gather(self, saver: Any, runs: int, steps: int) -> list[dict[str, Any]]:
        if self.variant == "graph":
            graph = _loop_graph(saver, _aloop_step)

            async def one() -> dict[str, Any]:
                clock = Clock()
                await graph.ainvoke(
                    {"i": 0, "n": steps}, _thread(self._key(), steps), durability="sync"
                )
                return clock.done(steps)

            return list(await asyncio.gather(*(one() for _ in range(runs))))
        run = entrypoint(checkpointer=saver)(_steps_async)
        return list(
            await asyncio.gather(
                *(
                    run.ainvoke({"n": steps}, _thread(self._key()), durability=self.durability)
                    for _ in range(runs)
                )
            )
        )

    def payload_run(self, n: int, size: int) -> str:
        key = self._key()
        if self.variant == "graph":
            graph = _loop_graph(self.saver, _loop_payload)
            graph.invoke({"i": 0, "n": n, "size": size}, _thread(key, n), durability="sync")
        else:
            run = entrypoint(checkpointer=self.saver)(_payload)
            run.invoke({"n": n, "size": size}, _thread(key), durability=self.durability)
        return key

    def start_ticks(self, run_key: str, path: str) -> None:
        run = entrypoint(checkpointer=self.saver)(_ticks)
        run.invoke({"path": path}, _thread(run_key), durability=self.durability)

    def resume_ticks(self, run_key: str, path: str) -> None:
        """What the application must do after a restart: invoke the thread again."""
        run = entrypoint(checkpointer=self.saver)(_ticks)
        run.invoke(None, _thread(run_key), durability=self.durability)
