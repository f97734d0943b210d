"""Tool attempt spans are kept when the attempt ends and made together later: each keeps
the times of its attempt and its parent, and none waits for the end of a long run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentledger import App, ToolContext
from agentledger.observe import _semconv as sc
from agentledger.observe import _spanbatch as spanbatch
from agentledger.observe import _tracing as tracing
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import Harness


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_provider(provider)
    yield exporter
    tracing.set_provider(None)


def _timed_app(steps: int, called: list[int]) -> App:
    app = App("observe-batch")

    @app.tool(timeout=2.0)
    async def look(ctx: ToolContext, i: int) -> int:
        called.append(time.time_ns())
        await asyncio.sleep(0)  # the attempt spans a hop of the event loop
        called.append(time.time_ns())
        return i

    @app.workflow(name="looks")
    async def looks(ctx: Any, input: Any) -> Any:
        return [await ctx.tool("look", i=i) for i in range(steps)]

    return app


async def test_each_tool_span_keeps_the_times_and_parent_of_its_attempt(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    steps = spanbatch.BATCH + 6  # one batch made when full, the rest when the run ends
    called: list[int] = []
    async with Harness(tmp_path, _timed_app(steps, called)) as h:
        run_id = await h.submit("looks")
        assert await h.execute(run_id, owner="w1") == RunStatus.COMPLETED
    spans = exporter.get_finished_spans()
    run = next(s for s in spans if s.name == "invoke_workflow looks")
    tools = sorted(
        (s for s in spans if s.name == "execute_tool look"), key=lambda s: s.attributes[sc.STEP_NO]
    )
    assert [s.attributes[sc.STEP_NO] for s in tools] == list(range(1, steps + 1))
    for i, span in enumerate(tools):
        assert span.start_time is not None and span.end_time is not None
        assert span.start_time <= called[2 * i] <= called[2 * i + 1] <= span.end_time
        assert span.parent is not None and span.parent.span_id == run.context.span_id
        assert span.context.trace_id == run.context.trace_id
        assert span.attributes[sc.STEP_OUTCOME] == "ok"
    assert run.start_time is not None and tools[0].start_time >= run.start_time


async def test_a_kept_span_is_made_while_its_run_still_executes(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    app = App("observe-batch-wait")
    release = asyncio.Event()

    @app.tool(timeout=2.0)
    async def look(ctx: ToolContext) -> int:
        return 1

    @app.workflow(name="look-then-wait")
    async def look_then_wait(ctx: Any, input: Any) -> Any:
        await ctx.tool("look")
        await ctx.step("wait", release.wait)  # a long step: the run goes on
        return 1

    async with Harness(tmp_path, app) as h:
        run_id = await h.submit("look-then-wait")
        running = asyncio.create_task(h.execute(run_id, owner="w1"))
        deadline = time.monotonic() + 10.0
        names: set[str] = set()
        while "execute_tool look" not in names and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            names = {s.name for s in exporter.get_finished_spans()}
        assert "execute_tool look" in names  # made while the run waits in its next step
        assert not running.done()
        release.set()
        assert await running == RunStatus.COMPLETED
