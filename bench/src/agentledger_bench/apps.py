"""The benchmark's App: no-op tools and workflows that time themselves.

Every workflow returns how long its steps took, measured *inside* the run: from
just before its first step to just after its last step was acknowledged (i.e.
committed). Claim, journal load and the final ``completed`` write are not in it.
``t_first``/``t_last`` are wall-clock times so that runs executed by several
worker processes can be put on one time line.

Workers load it with ``--app agentledger_bench.apps:app``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentledger._app import App
from agentledger._budget import Budget
from agentledger.engine._workflow_runner import WorkflowContext
from agentledger.tools._context import ToolContext

app = App("agentledger-bench")


def worker_command(url: str, *options: str) -> list[str]:
    """A worker process of this app on ``url`` (polling fast, no outbox)."""
    return [
        sys.executable, "-m", "agentledger.cli._main", "worker", "--app",
        "agentledger_bench.apps:app", "--db", url, "--poll-seconds", "0.05", "--no-outbox",
        *options,
    ]  # fmt: skip


# Large enough for every benchmark size; the default step budget would hand the
# 500-step run over to a human.
_BUDGET = Budget(
    max_steps=100_000, active_seconds=24 * 3600, max_tokens=10**12, max_spend_usd=10**9
)


@app.tool(effect="read", timeout=30.0)
async def bench_read(ctx: ToolContext, i: int) -> int:
    """A read that returns at once."""
    return i


@app.tool(effect="write", idempotency="provider", timeout=30.0)
async def bench_write(ctx: ToolContext, i: int) -> int:
    """A write whose provider honours our key; returns at once."""
    return i


def _noop(i: int) -> int:
    return i


def _message(i: int, size: int) -> str:
    """A ``size``-character message (distinct per step, not compressible to nothing)."""
    seed = f"{i:08d}-"
    return (seed * (size // len(seed) + 1))[:size]


async def _gate(input: dict[str, Any]) -> None:
    """Wait until the gate file exists (lets several worker processes start together)."""
    path = input.get("gate")
    if not path:
        return
    while not os.path.exists(path):
        await asyncio.sleep(0.005)


async def _timed(input: dict[str, Any], step: Callable[[int], Awaitable[Any]]) -> dict[str, Any]:
    """Run ``step(i)`` for i < ``steps`` after the gate; time them from inside the run."""
    await _gate(input)
    n = int(input["steps"])
    t0, w0 = time.perf_counter(), time.time()
    for i in range(n):
        await step(i)
    return {"steps": n, "elapsed_s": time.perf_counter() - t0, "t_first": w0, "t_last": time.time()}


async def bench_read_tool(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """``steps`` calls of the no-op read tool through ``ctx.tool``."""
    return await _timed(input, lambda i: ctx.tool("bench_read", i=i))


async def bench_step(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """``steps`` no-op ``ctx.step`` calls."""
    return await _timed(input, lambda i: ctx.step("noop", _noop, i))


async def bench_write_tool(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """``steps`` calls of the no-op write tool (journals ``started``, then the outcome)."""
    return await _timed(input, lambda i: ctx.tool("bench_write", i=i))


async def bench_payload(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """``steps`` ``ctx.step`` calls each returning a ``size``-character message."""
    size = int(input.get("size", 500))
    return await _timed(input, lambda i: ctx.step("message", _message, i, size))


async def bench_step_times(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """``steps`` no-op ``ctx.step`` calls, each timed on its own: ``[end wall time,
    seconds]`` per step (a latency distribution, not only a mean)."""
    times = []
    for i in range(int(input["steps"])):
        t0 = time.perf_counter()
        await ctx.step("noop", _noop, i)
        times.append([time.time(), time.perf_counter() - t0])
    return {"steps": len(times), "times": times}


async def bench_ticks(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """A long run of small steps a few milliseconds apart (for kill -> resume)."""
    for _ in range(int(input["ticks"])):
        await ctx.step("tick", time.time)
        await asyncio.sleep(0.005)
    return {"ticks": input["ticks"]}


for _fn in (
    bench_read_tool,
    bench_step,
    bench_write_tool,
    bench_payload,
    bench_step_times,
    bench_ticks,
):
    app.workflow(_fn, budget=_BUDGET)
