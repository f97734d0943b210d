"""Attempt spans handed to the SDK's processors finished are the spans the SDK makes:
the same names, kinds, attributes (in order), status, parents, trace flags and state,
resource and scope, under every sampler and span limit; and where a processor or a
configuration needs the SDK's own path, the spans take it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, TraceState
from opentelemetry.util.types import Attributes

from agentledger.observe import finished, tracing
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import KILLED, Harness
from tests.observe.apps import Payments, booking_agent_app


class DropPayments(Sampler):
    """Not a ParentBased sampler: drops the payment's spans, adds an attribute to the
    others and a trace state entry (the maker must ask it, span by span)."""

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
        if name.startswith("chat"):  # recorded, not sampled: processors drop it
            return SamplingResult(Decision.RECORD_ONLY, attributes)
        parent = trace.get_current_span(parent_context).get_span_context()
        state = (parent.trace_state if parent.is_valid else TraceState()).add("k", "v")
        return SamplingResult(
            Decision.RECORD_AND_SAMPLE, {**(attributes or {}), "sampled.by": "test"}, state
        )

    def get_description(self) -> str:
        return "DropPayments"


SAMPLERS: dict[str, Any] = {
    "default": None,  # the SDK's: ParentBased(ALWAYS_ON), from the environment
    "ratio": ParentBased(TraceIdRatioBased(1.0)),
    "custom": DropPayments(),
    "custom-delegate": ParentBased(ALWAYS_ON, local_parent_sampled=DropPayments()),
    "unsampled": ParentBased(ALWAYS_OFF),
}
LIMITS = {
    "none": None,
    "count": SpanLimits(max_span_attributes=6),
    "length": SpanLimits(max_span_attribute_length=5),
}


def _provider(
    sampler: Any, limits: SpanLimits | None, **kwargs: Any
) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        sampler=sampler,
        span_limits=limits,
        resource=Resource.create({"service.name": "finished"}),
        **kwargs,
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    tracing.set_provider(None)
    tracing.use_finished_spans(True)


async def _booking(tmp_path: Path, provider: TracerProvider, finished_spans: bool) -> str:
    """A booking agent killed in its payment and resumed: chat spans, tool spans (one
    ended in error), replayed steps, a run span joined to a stored remote parent."""
    tracing.set_provider(provider)
    tracing.use_finished_spans(finished_spans)
    try:
        async with Harness(tmp_path, booking_agent_app(Payments(kill_after_apply=True))) as h:
            run_id = await h.submit("booker", {"message": "book Paris"})
            assert await h.execute(run_id, owner="w1") == KILLED
            assert await h.execute(run_id, owner="w2") == RunStatus.COMPLETED
        return run_id
    finally:
        tracing.set_provider(None)
        tracing.use_finished_spans(True)


def _shape(spans: tuple[ReadableSpan, ...], run_id: str) -> list[dict[str, Any]]:
    """Everything a receiver sees of the spans, ids and times replaced by their order of
    appearance (so parent links and traces compare across two runs)."""
    ids: dict[int, int] = {}
    traces: dict[int, int] = {}

    def plain(value: Any) -> Any:
        return value.replace(run_id, "<run>") if isinstance(value, str) else value

    shaped = []
    for span in spans:
        assert span.start_time is not None and span.end_time is not None
        assert span.start_time <= span.end_time
        context, parent = span.context, span.parent
        assert context is not None
        shaped.append(
            {
                "name": span.name,
                "kind": span.kind,
                "id": ids.setdefault(context.span_id, len(ids)),
                "trace": traces.setdefault(context.trace_id, len(traces)),
                "flags": int(context.trace_flags),
                "state": list(context.trace_state.items()),
                "remote": context.is_remote,
                "parent": None
                if parent is None
                else (ids.setdefault(parent.span_id, len(ids)), parent.is_remote),
                "attributes": [(k, plain(v)) for k, v in span.attributes.items()],
                "dropped": span.dropped_attributes,
                "status": (span.status.status_code, span.status.description),
                "events": [(e.name, dict(e.attributes or {})) for e in span.events],
                "links": [(link.context, dict(link.attributes or {})) for link in span.links],
                "resource": dict(span.resource.attributes),
                "scope": span.instrumentation_scope,
            }
        )
    return shaped


@pytest.mark.parametrize("limits", list(LIMITS))
@pytest.mark.parametrize("sampler", list(SAMPLERS))
async def test_finished_spans_are_the_spans_the_sdk_makes(
    tmp_path: Path, sampler: str, limits: str
) -> None:
    shapes = []
    for finished_spans in (False, True):
        provider, exporter = _provider(SAMPLERS[sampler], LIMITS[limits])
        tracer = provider.get_tracer("agentledger")
        assert finished.maker(provider, tracer) is not None  # the finished path is taken
        run_id = await _booking(tmp_path / str(finished_spans), provider, finished_spans)
        shapes.append(_shape(exporter.get_finished_spans(), run_id))
    sdk, made = shapes
    assert made == sdk
    names = [s["name"] for s in sdk]
    if sampler == "unsampled":
        assert names == []
        return
    assert "execute_tool search" in names
    assert ("execute_tool pay" in names) == (sampler not in ("custom", "custom-delegate"))
    if sampler == "default" and limits == "none":  # what the comparison covered
        assert "chat scripted-booker" in names
        assert any(s["status"][0].name == "ERROR" for s in sdk)  # the killed payment
        assert any(s["parent"] and s["parent"][1] for s in sdk)  # a remote parent
        replayed = [s for s in sdk if ("agentledger.step.replayed", True) in s["attributes"]]
        assert replayed


class Recorder(SpanProcessor):
    """A processor with an ``on_start`` of its own (it could enrich or time spans)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: list[str] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started.append(span.name)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span.name)


async def test_a_processor_of_its_own_gets_the_sdk_spans(tmp_path: Path) -> None:
    provider, exporter = _provider(None, None)
    assert finished.maker(provider, provider.get_tracer("agentledger")) is not None
    await _booking(tmp_path / "1", provider, True)  # the maker is cached for the provider
    first = [s.name for s in exporter.get_finished_spans()]
    assert "execute_tool search" in first
    recorder = Recorder()
    provider.add_span_processor(recorder)  # after: the cached maker must notice
    assert finished.maker(provider, provider.get_tracer("agentledger")) is None
    await _booking(tmp_path / "2", provider, True)
    assert "execute_tool search" in recorder.started  # its on_start saw the tool span
    assert "chat scripted-booker" in recorder.started
    assert sorted(recorder.started) == sorted(recorder.ended)


def test_only_the_sdks_own_provider_and_processors_get_finished_spans() -> None:
    class Provider(TracerProvider):
        pass

    sub = Provider()
    sub.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    assert finished.maker(sub, sub.get_tracer("agentledger")) is None
    batch = TracerProvider()
    batch.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    assert finished.maker(batch, batch.get_tracer("agentledger")) is not None
    batch.shutdown()


def _tool_attempt(fail: bool) -> None:
    from types import SimpleNamespace as NS

    exe = NS(run=NS(id="run_1"))
    tool = NS(name="lookup", writes=False)
    try:
        with tracing.tool_attempt(exe, NS(step_no=3), tool, "run_1:3:lookup:k", 2):
            if fail:
                raise ValueError("no answer")
    except ValueError:
        pass


def test_an_attempt_without_a_parent_span_goes_the_sdks_way() -> None:
    # No current span: the SDK makes a root span (a new trace, the root sampler): the
    # maker leaves it to the SDK, and both paths give the same span.
    shapes = []
    for finished_spans in (False, True):
        provider, exporter = _provider(None, None)
        tracing.set_provider(provider)
        tracing.use_finished_spans(finished_spans)
        _tool_attempt(fail=True)
        _tool_attempt(fail=False)
        spans = exporter.get_finished_spans()
        assert [s.parent for s in spans] == [None, None]
        shapes.append(_shape(spans, "run_1"))
    assert shapes[0] == shapes[1]
    assert shapes[0][0]["status"][0].name == "ERROR" and shapes[0][0]["status"][1] == "no answer"


def test_the_sdks_internal_metrics_count_finished_spans_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    counts = []
    for finished_spans in (False, True):
        reader = InMemoryMetricReader()
        provider, exporter = _provider(None, None, meter_provider=MeterProvider([reader]))
        tracing.set_provider(provider)
        tracing.use_finished_spans(finished_spans)
        tracer = provider.get_tracer("agentledger")
        with tracer.start_as_current_span("parent"):
            for _ in range(3):
                _tool_attempt(fail=False)
        data = reader.get_metrics_data()
        assert data is not None
        points = {
            metric.name: sum(p.value for p in metric.data.data_points)  # type: ignore[union-attr]
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name.startswith("otel.sdk.span")
        }
        counts.append(points)
        assert len(exporter.get_finished_spans()) == 4
    assert counts[0] == counts[1]
    assert counts[1]["otel.sdk.span.started"] == 4 and counts[1]["otel.sdk.span.live"] == 0


def _received(bodies: list[bytes], run_id: str) -> list[Any]:
    """What a receiver got: every span of the export requests, ids replaced by their
    order of appearance, times dropped, the run id replaced."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    ids: dict[bytes, int] = {}
    received = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    assert span.start_time_unix_nano <= span.end_time_unix_nano
                    for field in ("trace_id", "span_id", "parent_span_id"):
                        value = getattr(span, field)
                        if value:
                            setattr(span, field, bytes([ids.setdefault(value, len(ids))]))
                    span.start_time_unix_nano = span.end_time_unix_nano = 0
                    for kv in span.attributes:
                        if kv.value.HasField("string_value"):
                            kv.value.string_value = kv.value.string_value.replace(run_id, "<run>")
                    received.append(
                        (resource_spans.resource, scope_spans.scope, span.SerializeToString())
                    )
    return received


async def test_a_receiver_gets_the_same_spans_as_before(tmp_path: Path) -> None:
    # The whole export path as configured (finished spans, agentledger's exporter) against
    # the SDK's spans through the official exporter: the same requests' content.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as OfficialExporter,
    )

    from agentledger_bench.observe_overhead import CollectorStub

    results = []
    for configured in (False, True):
        collector = CollectorStub(keep_bodies=True)
        try:
            if configured:
                provider = tracing.otlp_provider(collector.url)
            else:
                provider = TracerProvider()
                exporter = OfficialExporter(endpoint=collector.url)
                provider.add_span_processor(BatchSpanProcessor(exporter))
            run_id = await _booking(tmp_path / str(configured), provider, configured)
            assert provider.force_flush()
            provider.shutdown()
            results.append(_received(collector.bodies, run_id))
        finally:
            collector.close()
    before, now = results
    assert len(now) >= 10 and now == before
