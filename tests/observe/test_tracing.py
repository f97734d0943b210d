"""Spans of a run killed mid-payment and resumed by another execution: one trace, the
GenAI names, replayed steps marked (issue 11, item 1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agentledger.observe import _semconv as sc
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import KILLED, Harness
from tests.observe.apps import Payments, booking_app

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


async def test_a_resumed_run_continues_one_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    payments = Payments(kill_after_apply=True)
    async with Harness(tmp_path, booking_app(payments)) as h:
        run_id = await h.submit("booking")
        assert await h.execute(run_id, owner="w1") == KILLED
        assert await h.execute(run_id, owner="w2") == RunStatus.COMPLETED
    found = [s for s in spans.get_finished_spans() if s.attributes.get(sc.RUN_ID) == run_id]
    assert len({s.context.trace_id for s in found}) == 1  # one trace across both executions
    names = [s.name for s in found]
    assert names.count("invoke_workflow booking") == 2
    tools = [s for s in found if s.name.startswith("execute_tool ")]
    fresh = [(s.name, s.attributes[sc.STEP_REPLAYED]) for s in tools]
    # First execution: search, then pay (killed). Second: search replayed, pay settled by
    # its status check (no new call), confirm is a plain step.
    assert ("execute_tool search", False) in fresh and ("execute_tool search", True) in fresh
    pay = [s for s in tools if s.name == "execute_tool pay"]
    assert pay and pay[0].attributes[sc.GEN_AI_TOOL_NAME] == "pay"
    assert pay[0].attributes[sc.TOOL_EFFECT] == "write"
    # The step's idempotency key is the tool call id (one attribute, not a copy of it).
    assert str(pay[0].attributes[sc.GEN_AI_TOOL_CALL_ID]).startswith(f"{run_id}:2:pay:")
    assert len(payments.charges) == 1
    search = next(
        s for s in tools if s.name == "execute_tool search" and not s.attributes[sc.STEP_REPLAYED]
    )
    attrs = search.attributes
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert attrs[sc.GEN_AI_TOOL_TYPE] == "function" and attrs[sc.TOOL_EFFECT] == "read"
    assert attrs[sc.STEP_NO] == 1 and attrs[sc.STEP_OUTCOME] == "ok"
    assert str(attrs[sc.GEN_AI_TOOL_CALL_ID]).startswith(f"{run_id}:1:search:")
    assert isinstance(attrs[sc.STEP_ATTEMPT], int)
    # The first execution was killed inside the payment: that attempt ended in error.
    killed = [s for s in pay if s.attributes[sc.STEP_OUTCOME] != "ok"]
    assert killed and killed[0].attributes[sc.ERROR_TYPE] == killed[0].attributes[sc.STEP_OUTCOME]
    assert killed[0].status.status_code == StatusCode.ERROR
    runs = [s for s in found if s.name.startswith("invoke_workflow")]
    assert all(s.attributes[sc.GEN_AI_OPERATION_NAME] == "invoke_workflow" for s in runs)
    second = max(runs, key=lambda s: s.start_time or 0)
    assert second.parent is not None  # joined to the stored context of the first
