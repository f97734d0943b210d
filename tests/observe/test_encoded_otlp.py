"""The encoding span processor (what ``otlp_provider`` configures) sends what the SDK's
``BatchSpanProcessor`` into the official exporter sends: the same request bytes for the
same spans (attributes of every type, events, links, status, error spans, scopes and
resources, unsampled spans left out), spans encoded from their fields equal to the
official encoding of the same ``ReadableSpan``, and the batch processor's behaviour
(queue full drops the oldest, batch size, schedule delay, force_flush, shutdown,
``OTEL_BSP_*``) against a real collector on loopback."""

from __future__ import annotations

import gc
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as official
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as OfficialExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanProcessor
from opentelemetry.sdk.trace.sampling import (
    Decision,
    Sampler,
    SamplingResult,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from agentledger.observe import finished, otlp, tracing
from agentledger.observe.encoded import EncodingSpanProcessor, encoding_processor
from agentledger_bench.observe_overhead import CollectorStub
from tests.observe.test_otlp_encoding import VALUES, _sdk_spans

RESOURCE = Resource.create({"service.name": "svc"}, "https://schema/r")
SCOPE = InstrumentationScope("agentledger", "1.0", "https://schema/s")
SAMPLED = TraceFlags(TraceFlags.SAMPLED)

# Attributes as the engine sets them on attempt spans, and every plain type at its edges.
ENGINE = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "search",
    "agentledger.step.replayed": False,
    "gen_ai.tool.call.id": "run_1:3:search:k",
    "agentledger.step.no": 3,
    "agentledger.step.attempt": 1,
    "gen_ai.usage.input_tokens": 2**40,
    "gen_ai.response.finish_reasons": ["stop"],
    "error.type": "TimeoutError",
    "ratio": 0.25,
}
# What a finished tool or model attempt span carries: plain values only.
ATTEMPT = {k: v for k, v in ENGINE.items() if not isinstance(v, list)}
PLAIN = {k: v for k, v in VALUES.items() if type(v) in (str, bool, int, float)}


@pytest.fixture
def collector() -> Iterator[CollectorStub]:
    stub = CollectorStub(keep_bodies=True)
    yield stub
    stub.close()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    tracing.set_provider(None)
    tracing.use_finished_spans(True)


def _readable(
    attributes: dict[str, Any],
    status: Status,
    parent: SpanContext | None,
    state: TraceState | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> ReadableSpan:
    context = SpanContext(2**128 - 3, 2**64 - 5, False, SAMPLED, state)
    return ReadableSpan(
        "execute_tool search",
        context,
        parent,
        resource=RESOURCE,
        attributes=attributes,
        kind=kind,
        start_time=1_700_000_000_000_000_000,
        end_time=1_700_000_000_000_123_456,
        instrumentation_scope=SCOPE,
        status=status,
    )


PARENTS = {
    "local": SpanContext(7, 11, is_remote=False, trace_flags=SAMPLED),
    "remote": SpanContext(7, 12, is_remote=True, trace_flags=SAMPLED),
    "none": None,
}
STATUSES = {
    "unset": Status(StatusCode.UNSET),
    "ok": Status(StatusCode.OK),
    "error": Status(StatusCode.ERROR, "TimeoutError: no answer in 30 s — ünïcode"),
    "error-bare": Status(StatusCode.ERROR),
}


@pytest.mark.parametrize("parent", list(PARENTS))
@pytest.mark.parametrize("status", list(STATUSES))
@pytest.mark.parametrize("attributes", ["engine", "plain", "none"])
def test_a_span_encoded_from_its_fields_is_the_official_encoding(
    parent: str, status: str, attributes: str
) -> None:
    values = {"engine": ENGINE, "plain": PLAIN, "none": {}}[attributes]
    state = TraceState([("vendor", "v1")]) if parent == "remote" else None
    for kind in SpanKind:
        span = _readable(values, STATUSES[status], PARENTS[parent], state, kind)
        context = span.context
        assert context is not None
        body = otlp.span_message(
            context.trace_id,
            context.span_id,
            context.trace_state,
            span.parent,
            span.name,
            kind,
            span.start_time,
            span.end_time,
            values,
            STATUSES[status],
        )
        expected = official([span]).SerializePartialToString()
        assert otlp.encode_request({RESOURCE: {SCOPE: [body]}}) == expected
        assert otlp.span_bytes(span) == body


def test_events_links_and_odd_values_encode_as_the_official_encoder() -> None:
    # span_bytes of every SDK span (events, links, dropped counts, nested values) and of
    # a span the fast encoder leaves to the official one: the same bytes in a request.
    spans = list(_sdk_spans())
    odd = _readable({"ok": "x", "too.big": 2**64, "nan": math.nan}, STATUSES["ok"], None)
    for span in [*spans, odd]:
        request = otlp.encode_request(
            {span.resource: {span.instrumentation_scope: [otlp.span_bytes(span)]}}
        )
        assert request == official([span]).SerializePartialToString()


def _processors(url: str, **settings: Any) -> list[tuple[str, SpanProcessor]]:
    """The encoding processor and, for comparison, the SDK's processor into the
    official exporter, with the same settings."""
    return [
        ("encoding", EncodingSpanProcessor(otlp.OTLPSpanExporter(endpoint=url), **settings)),
        ("sdk", BatchSpanProcessor(OfficialExporter(endpoint=url), **settings)),
    ]


def _spans_of(bodies: Sequence[bytes]) -> list[str]:
    names: list[str] = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                names.extend(s.name for s in ss.spans)
    return names


def _unsampled(name: str) -> ReadableSpan:
    context = SpanContext(5, 6, False, TraceFlags(TraceFlags.DEFAULT))
    return ReadableSpan(name, context, resource=RESOURCE, instrumentation_scope=SCOPE)


def test_a_batch_is_the_request_the_sdk_processor_sends(collector: CollectorStub) -> None:
    # Spans of two scopes and two resources interleaved, an unsampled one (left out), one
    # the fast encoder cannot handle: the same request body from both processors.
    spans = list(_sdk_spans())
    other = Resource({"service.name": "other"})
    spans.insert(2, _readable(ENGINE, STATUSES["error"], PARENTS["local"]))
    spans.insert(3, ReadableSpan("elsewhere", SpanContext(1, 2, False, SAMPLED), resource=other))
    spans.insert(4, _unsampled("never sent"))
    spans.append(_readable({"too.big": 2**64}, STATUSES["ok"], None))
    sent = []
    for _, processor in _processors(collector.url, schedule_delay_millis=600_000):
        collector.bodies.clear()
        for span in spans:
            processor.on_end(span)
        assert processor.force_flush()
        sent.append(list(collector.bodies))
        processor.shutdown()
    assert len(sent[0]) == 1 and sent[0] == sent[1]
    names = _spans_of(sent[0])
    assert "elsewhere" in names and "never sent" not in names and len(names) == len(spans) - 1


class _Held:
    """Holds the collector's request handlers until released (the exporter's thread
    is then busy posting while spans keep ending)."""

    def __init__(self, collector: CollectorStub) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()
        handler = collector.server.RequestHandlerClass
        original = handler.do_POST  # type: ignore[attr-defined]
        held = self

        def do_post(request: Any) -> None:
            held.arrived.set()
            held.release.wait(30)
            original(request)

        handler.do_POST = do_post  # type: ignore[attr-defined]


def test_a_full_queue_drops_the_oldest_spans_as_the_sdk_does(collector: CollectorStub) -> None:
    held = _Held(collector)
    results = []
    for _, processor in _processors(
        collector.url, max_queue_size=8, max_export_batch_size=4, schedule_delay_millis=600_000
    ):
        collector.bodies.clear()
        held.arrived.clear()
        held.release.clear()
        for n in range(4):  # a full batch: the thread exports it and waits for the reply
            processor.on_end(_readable({"n": n}, STATUSES["unset"], None))
        assert held.arrived.wait(10)
        for n in range(4, 14):  # 10 more into a queue of 8: the two oldest are dropped
            processor.on_end(_readable({"n": n}, STATUSES["unset"], None))
        held.release.set()
        assert processor.force_flush()
        processor.shutdown()
        results.append(_numbers(collector.bodies))
    assert results[0] == results[1] == [0, 1, 2, 3, *range(6, 14)]


def _numbers(bodies: Sequence[bytes]) -> list[int]:
    numbers: list[int] = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    assert len(ss.spans) <= 4  # the batch size
                    numbers.extend(kv.value.int_value for kv in span.attributes)
    return numbers


def test_batch_size_force_flush_and_shutdown(
    collector: CollectorStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batch size from OTEL_BSP_MAX_EXPORT_BATCH_SIZE; force_flush exports everything, in
    # batches of at most that size, in order; shutdown exports what is left, then
    # refuses spans and shuts the exporter down.
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    processor = encoding_processor(otlp.OTLPSpanExporter(endpoint=collector.url))
    assert type(processor) is EncodingSpanProcessor
    for n in range(10):
        processor.on_end(_readable({"n": n}, STATUSES["unset"], None))
    assert processor.force_flush()
    assert _numbers(collector.bodies) == list(range(10)) and len(collector.bodies) == 3
    collector.bodies.clear()
    for n in range(3):
        processor.on_end(_readable({"n": n}, STATUSES["unset"], None))
    processor.shutdown()
    assert _numbers(collector.bodies) == [0, 1, 2]
    processor.on_end(_readable({"n": 9}, STATUSES["unset"], None))
    assert not processor.force_flush()
    assert processor.span_exporter._shutdown
    assert _numbers(collector.bodies) == [0, 1, 2]


def test_the_schedule_delay_exports_without_a_flush(
    collector: CollectorStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    processor = encoding_processor(otlp.OTLPSpanExporter(endpoint=collector.url))
    processor.on_end(_readable({"n": 1}, STATUSES["unset"], None))
    deadline = time.monotonic() + 10
    while not collector.bodies and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _numbers(collector.bodies) == [1]
    processor.shutdown()


class RecordOnlyChats(Sampler):
    """Asked span by span: chat spans recorded but not sampled (never exported)."""

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        name = args[2] if len(args) > 2 else kwargs["name"]
        if name.startswith("chat"):
            return SamplingResult(Decision.RECORD_ONLY)
        return SamplingResult(Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "RecordOnlyChats"


def test_finished_spans_skip_the_readable_span_and_send_the_same_request(
    collector: CollectorStub,
) -> None:
    # Under the encoding processor, attempt spans are encoded from their fields: the
    # request is the official encoding of the spans an in-memory exporter gets from the
    # SDK's own path, and a recorded-but-unsampled span is not sent.
    provider = TracerProvider(sampler=RecordOnlyChats(), resource=RESOURCE)
    provider.add_span_processor(encoding_processor(otlp.OTLPSpanExporter(endpoint=collector.url)))
    tracer = provider.get_tracer("agentledger", "1.0", schema_url="https://schema/s")
    made = finished.maker(provider, tracer)
    assert made is not None and made._encoders is not None
    with tracer.start_as_current_span("invoke_workflow booking") as root:
        attempts: list[tuple[str, dict[str, Any], Status | None]] = [
            ("execute_tool search", {"agentledger.step.outcome": "ok"}, None),
            ("chat gpt", {}, None),
            ("execute_tool pay", {"error.type": "E"}, Status(StatusCode.ERROR, "boom")),
            ("execute_tool list", {"list": ["a", "b"]}, None),  # not plain: ReadableSpan
            # Plain but outside int64: the official encoder's encoding (which drops it).
            ("execute_tool big", {"too.big": 2**64}, None),
        ]
        for n, (name, ending, status) in enumerate(attempts):
            pending = made.start(name, {**ATTEMPT, "agentledger.step.no": n})
            assert pending is not None
            pending.end(ending, status)
    assert provider.force_flush()
    provider.shutdown()
    (body,) = collector.bodies
    received = ExportTraceServiceRequest()
    received.ParseFromString(body)
    spans = received.resource_spans[0].scope_spans[0].spans
    assert [s.name for s in spans] == [
        "execute_tool search",
        "execute_tool pay",
        "execute_tool list",
        "execute_tool big",
        "invoke_workflow booking",
    ]
    assert [kv.key for kv in spans[3].attributes if kv.key == "too.big"] == []
    assert {s.parent_span_id for s in spans[:4]} == {
        root.get_span_context().span_id.to_bytes(8, "big")
    }
    rebuilt = [_rebuilt(span, tracer) for span in spans]
    assert official(rebuilt).SerializePartialToString() == body


def _rebuilt(span: Any, tracer: Any) -> ReadableSpan:
    """The ReadableSpan a receiver's span describes (to encode it officially)."""

    def value(v: Any) -> Any:
        which = v.WhichOneof("value")
        if which == "array_value":
            return tuple(value(x) for x in v.array_value.values)
        return getattr(v, which)

    parent = (
        SpanContext(
            int.from_bytes(span.trace_id, "big"), int.from_bytes(span.parent_span_id, "big"), False
        )
        if span.parent_span_id
        else None
    )
    return ReadableSpan(
        span.name,
        SpanContext(
            int.from_bytes(span.trace_id, "big"),
            int.from_bytes(span.span_id, "big"),
            False,
            SAMPLED,
        ),
        parent,
        resource=tracer.resource,
        attributes={kv.key: value(kv.value) for kv in span.attributes},
        kind=SpanKind(span.kind - 1),
        start_time=span.start_time_unix_nano,
        end_time=span.end_time_unix_nano,
        instrumentation_scope=tracer._instrumentation_scope,
        status=Status(StatusCode(span.status.code), span.status.message or None),
    )


def test_a_users_own_processor_keeps_the_sdk_path(collector: CollectorStub) -> None:
    # A provider with the encoding processor and a processor of the user's: finished
    # spans go through on_end as ReadableSpans (no field encoding), or the SDK's path.
    provider = TracerProvider()
    provider.add_span_processor(encoding_processor(otlp.OTLPSpanExporter(endpoint=collector.url)))
    made = finished.maker(provider, provider.get_tracer("agentledger"))
    assert made is not None and made._encoders is not None
    provider.add_span_processor(BatchSpanProcessor(OfficialExporter(endpoint=collector.url)))
    made = finished.maker(provider, provider.get_tracer("agentledger"))
    assert made is not None and made._encoders is None
    provider.shutdown()


def _encoding_provider(
    collector: CollectorStub,
) -> tuple[Any, TracerProvider, Any, finished.SpanMaker]:
    """A provider exporting through the encoding processor to ``collector``, its tracer
    and its maker of finished spans."""
    processor = encoding_processor(otlp.OTLPSpanExporter(endpoint=collector.url))
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("agentledger")
    made = finished.maker(provider, tracer)
    assert made is not None
    return processor, provider, tracer, made


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_exports_its_own_spans_once(collector: CollectorStub) -> None:
    # As the SDK's processor: the child starts with an empty queue and a thread of its
    # own; what the parent queued is exported once, by the parent.
    processor, provider, tracer, made = _encoding_provider(collector)
    with tracer.start_as_current_span("parent"):
        pending = made.start("queued by the parent", {"n": 1})
        assert pending is not None
        pending.end({}, None)
        pid = os.fork()
        if pid == 0:  # the child: one span of its own, flushed, then gone
            code = 1
            try:
                child = made.start("queued by the child", {"n": 2})
                assert child is not None
                child.end({}, None)
                code = 0 if processor.force_flush() else 2
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _spans_of(collector.bodies) == ["queued by the child"]
    assert provider.force_flush()
    provider.shutdown()
    assert sorted(_spans_of(collector.bodies)) == sorted(
        ["queued by the child", "queued by the parent", "parent"]
    )


def test_what_is_queued_is_untracked_by_the_garbage_collector(collector: CollectorStub) -> None:
    # Queued spans wait up to the schedule delay: nothing of theirs may stay tracked (and
    # be promoted to an older generation) once a collection has looked at it.
    processor, provider, tracer, made = _encoding_provider(collector)
    with tracer.start_as_current_span("run"):  # ended through the SDK: queued as bytes
        for n in range(3):
            pending = made.start("execute_tool search", {**ATTEMPT, "agentledger.step.no": n})
            assert pending is not None
            pending.end({"agentledger.step.outcome": "ok"}, Status(StatusCode.ERROR, "x"))
    queued = list(processor._batch_processor._queue)
    assert len(queued) == 4
    gc.collect()
    assert [gc.is_tracked(item) for item in queued] == [False] * 4
    assert processor.force_flush()
    assert _spans_of(collector.bodies) == ["execute_tool search"] * 3 + ["run"]
    provider.shutdown()
