"""Every span goes one way: the provider's public ``Tracer.start_span``, its sampler, span
limits and processors; the tracing hooks need only the OpenTelemetry API, and no module
of agentledger imports a private OpenTelemetry module."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, TraceState
from opentelemetry.util.types import Attributes

import agentledger
from agentledger.observe import _semconv as sc
from agentledger.observe import _tracing as tracing
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import KILLED, Harness
from tests.observe.apps import Payments, booking_agent_app

SRC = Path(agentledger.__file__).parent


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    tracing.set_provider(None)


class Recorder(SpanProcessor):
    """A processor of the user's own: sees every span start and end."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started.append(span.name)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


class DropPayments(Sampler):
    """Drops the payment's spans, records the chats without sampling them, and adds an
    attribute and a trace state entry to the others."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Any = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if name == "execute_tool pay":
            return SamplingResult(Decision.DROP)
        if name.startswith("chat"):
            return SamplingResult(Decision.RECORD_ONLY, attributes)
        parent = trace.get_current_span(parent_context).get_span_context()
        state = (parent.trace_state if parent.is_valid else TraceState()).add("k", "v")
        return SamplingResult(
            Decision.RECORD_AND_SAMPLE, {**(attributes or {}), "sampled.by": "test"}, state
        )

    def get_description(self) -> str:
        return "DropPayments"


async def _booking(tmp_path: Path, provider: TracerProvider) -> str:
    """A booking agent killed in its payment and resumed: chat, tool and replayed spans."""
    tracing.set_provider(provider)
    async with Harness(tmp_path, booking_agent_app(Payments(kill_after_apply=True))) as h:
        run_id = await h.submit("booker", {"message": "book Paris"})
        assert await h.execute(run_id, owner="w1") == KILLED
        assert await h.execute(run_id, owner="w2") == RunStatus.COMPLETED
    return run_id


async def test_every_span_reaches_the_providers_processors(tmp_path: Path) -> None:
    recorder, exporter = Recorder(), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(recorder)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await _booking(tmp_path, provider)
    exported = [s.name for s in exporter.get_finished_spans()]
    assert sorted(recorder.started) == sorted(s.name for s in recorder.ended) == sorted(exported)
    for name in ("invoke_agent booker", "chat scripted-booker", "execute_tool search"):
        assert name in recorder.started
    assert any(s.attributes and s.attributes.get(sc.STEP_REPLAYED) for s in recorder.ended)


async def test_the_providers_sampler_and_span_limits_decide(tmp_path: Path) -> None:
    recorder, exporter = Recorder(), InMemorySpanExporter()
    provider = TracerProvider(sampler=DropPayments(), span_limits=SpanLimits(max_span_attributes=6))
    provider.add_span_processor(recorder)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await _booking(tmp_path, provider)
    exported = exporter.get_finished_spans()
    names = {s.name for s in exported}
    assert "execute_tool search" in names and "invoke_agent booker" in names
    assert "execute_tool pay" not in {s.name for s in recorder.ended}  # dropped: not recorded
    # Recorded but not sampled: the processors see the chats, the exporter never does.
    assert "chat scripted-booker" in {s.name for s in recorder.ended}
    assert "chat scripted-booker" not in names
    for span in exported:
        assert span.attributes is not None and len(span.attributes) <= 6
        assert span.context is not None and span.context.trace_state.get("k") == "v"
    tool = next(s for s in exported if s.name == "execute_tool search")
    assert tool.dropped_attributes > 0  # a tool attempt carries more than six


def test_the_tracing_hooks_need_only_the_api() -> None:
    # The SDK and the exporter are loaded by the code that sets a pipeline up, not by
    # importing the hooks the engine calls.
    code = (
        "import sys, agentledger.observe._tracing, agentledger.engine._runner;"
        "print(sorted(m for m in sys.modules"
        " if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_no_module_imports_a_private_opentelemetry_name() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
                modules = [node.module or ""]
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names if a.name.startswith("opentelemetry")]
                names = []
            else:
                continue
            parts = [p for m in modules for p in m.split(".")] + names
            if any(p.startswith("_") for p in parts):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []


def test_the_observability_modules_read_no_private_name_of_another_object() -> None:
    # A private attribute is read only on the module's own objects (``self``), never on
    # an SDK object nor through ``getattr`` with a private name.
    found = []
    for path in sorted((SRC / "observe").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")
            ):
                found.append(f"{path.name}:{node.lineno} {node.func.id} {node.args[1].value}")
    assert found == []
