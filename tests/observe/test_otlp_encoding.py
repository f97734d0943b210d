"""agentledger's OTLP span encoder sends what the official encoder sends: the same bytes
and the same decoded message over every attribute type, events, links, status, parents,
trace state, resources and scopes; anything it does not handle goes to the official
encoder; the exporter posts those bytes to a collector on loopback."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as official
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as OfficialExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from agentledger.observe import _otlp as otlp
from agentledger_bench._watchers import CollectorStub

# The encoder is used only on the SDK versions it is tested with; on another one the
# exporter is the official one and these comparisons do not apply.
pytestmark = pytest.mark.skipif(
    bool(otlp.untested_versions()), reason="SDK versions the fast encoder is not tested with"
)


class Color(enum.Enum):
    RED = "red"


class Mode(enum.StrEnum):
    FAST = "fast"


class Level(enum.IntEnum):
    HIGH = 3


# Every value type the SDK keeps in an attribute, at its edges.
VALUES: dict[str, Any] = {
    "s": "text",
    "s.empty": "",
    "s.unicode": "naïve — 東京 🚀",
    "b.true": True,
    "b.false": False,
    "i.zero": 0,
    "i.one": 1,
    "i.127": 127,
    "i.128": 128,
    "i.16383": 16383,
    "i.16384": 16384,
    "i.neg": -1,
    "i.min": -(2**63),
    "i.max": 2**63 - 1,
    "f.zero": 0.0,
    "f.negzero": -0.0,
    "f.pi": math.pi,
    "f.inf": math.inf,
    "f.nan": math.nan,
    "bytes": b"\x00\xffraw",
    "bytes.empty": b"",
    "seq.str": ("a", "", "c"),
    "seq.bool": [True, False],
    "seq.int": (1, -2, 2**40),
    "seq.float": (1.5, -0.0),
    "seq.empty": (),
    "seq.mixed": ("a", 1, None, b"x", ("nested",)),
    "map": {"n": 1, "deep": {"x": "y"}, "none": None},
    "none.in.map.only": {"": "empty key"},
    "str.subclass": Mode.FAST,
    "int.subclass": Level.HIGH,
}


def _exported(limits: SpanLimits | None = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "svc", "k": 1}, "https://schema/r"),
        span_limits=limits,
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _sdk_spans(live: list[ReadableSpan] | None = None) -> Sequence[ReadableSpan]:
    """Spans made by the SDK with everything the OTLP span message carries (as the
    processors get them; ``live`` collects the SDK's own span objects too)."""
    provider, exporter = _exported()
    tracer = provider.get_tracer("agentledger", "1.2.3", schema_url="https://schema/s")
    other = provider.get_tracer("another-scope")
    state = TraceState([("vendor", "v1"), ("other", "x")])
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=state,
    )
    link = SpanContext(2**128 - 1, 2**64 - 1, is_remote=False)
    root = tracer.start_span("root", kind=SpanKind.SERVER, attributes=VALUES)
    root.add_event("event.plain")
    root.add_event("event.attrs", {"e.s": "v", "e.i": 7, "e.seq": ["x"]}, timestamp=123)
    root.set_status(Status(StatusCode.OK))
    parent = set_span_in_context(root)
    for kind in SpanKind:
        child = tracer.start_span(
            f"child {kind.name}",
            context=parent,
            kind=kind,
            attributes={"n": kind.value},
            links=[Link(link, {"l.s": "x", "l.b": False}), Link(remote)],
        )
        child.set_status(Status(StatusCode.ERROR, "it failed: ünïcode"))
        child.end()
    error_only = tracer.start_span("error without description", context=parent)
    error_only.set_status(Status(StatusCode.ERROR))
    error_only.end()
    joined = tracer.start_span(
        "child of a remote parent", context=set_span_in_context(_remote_span(remote))
    )
    joined.end()
    nameless = other.start_span("", attributes={})  # no name nor attributes, another scope
    nameless.end()
    root.end()
    if live is not None:
        live.extend([root, error_only, joined, nameless])  # type: ignore[list-item]
    return exporter.get_finished_spans()


def _remote_span(context: SpanContext) -> Any:
    from opentelemetry.trace import NonRecordingSpan

    return NonRecordingSpan(context)


def _assert_same(spans: Sequence[ReadableSpan]) -> bytes:
    expected = official(spans).SerializeToString()
    assert expected == official(spans).SerializePartialToString()  # what the exporter sends
    got = otlp.encode_spans(spans)
    assert got is not None
    decoded, wanted = ExportTraceServiceRequest(), ExportTraceServiceRequest()
    decoded.ParseFromString(got)
    wanted.ParseFromString(expected)
    assert decoded == wanted  # the same message (clearer failure than the bytes)
    assert got == expected  # and the same bytes
    return got


def test_every_field_and_attribute_type_encodes_as_the_official_encoder() -> None:
    spans = _sdk_spans()
    sent = ExportTraceServiceRequest()
    sent.ParseFromString(_assert_same(spans))
    # What the comparison covered: two scopes, events, links, remote parents, state.
    scopes = sent.resource_spans[0].scope_spans
    assert {s.scope.name for s in scopes} == {"agentledger", "another-scope"}
    everything = [span for scope in scopes for span in scope.spans]
    assert any(s.events for s in everything) and any(s.links for s in everything)
    assert any(s.flags & 0x200 for s in everything)  # a remote parent
    assert any(s.trace_state for s in everything)
    root = next(s for s in everything if s.name == "root")
    assert len(root.attributes) == len(VALUES)


class Renamed(ReadableSpan):
    """A span class of its own: the encoders read it through its properties."""

    @property
    def name(self) -> str:
        return "renamed " + self._name


def test_sdk_span_objects_and_span_subclasses_encode_as_the_official_encoder() -> None:
    live: list[ReadableSpan] = []
    _sdk_spans(live)
    assert all(type(s) is not ReadableSpan for s in live)  # the SDK's Span class
    _assert_same(live)
    renamed = Renamed("x", SpanContext(1, 2, is_remote=False), attributes={"a": 1})
    sent = ExportTraceServiceRequest()
    sent.ParseFromString(_assert_same([renamed]))
    assert sent.resource_spans[0].scope_spans[0].spans[0].name == "renamed x"


def test_dropped_counts_and_truncation_encode_as_the_official_encoder() -> None:
    limits = SpanLimits(
        max_span_attributes=3,
        max_events=1,
        max_links=1,
        max_event_attributes=1,
        max_link_attributes=1,
        max_span_attribute_length=2,
    )
    provider, exporter = _exported(limits)
    tracer = provider.get_tracer("agentledger")
    link = SpanContext(5, 6, is_remote=False)
    span = tracer.start_span(
        "limited", attributes=VALUES, links=[Link(link, {"a": 1, "b": 2}), Link(link)]
    )
    span.add_event("one", {"a": 1, "b": 2})
    span.add_event("two")
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert finished.dropped_attributes and finished.dropped_events and finished.dropped_links
    _assert_same([finished])


def test_spans_of_equal_resources_and_scopes_are_grouped_as_the_official_encoder() -> None:
    # Equal but distinct Resource / scope objects share a group; spans of an unequal one
    # form their own, in order of first appearance, interleaved in the batch.
    scope = InstrumentationScope("agentledger", "1")
    same_scope = InstrumentationScope("agentledger", "1")
    other_scope = InstrumentationScope("other", None, "https://schema/o")
    first = Resource({"service.name": "a"})
    equal = Resource({"service.name": "a"})
    other = Resource({"service.name": "b"}, "https://schema/b")
    context = SpanContext(1, 2, is_remote=False)
    spans = [
        ReadableSpan("1", context, resource=first, instrumentation_scope=scope),
        ReadableSpan("2", context, resource=other, instrumentation_scope=scope),
        ReadableSpan("3", context, resource=equal, instrumentation_scope=same_scope),
        ReadableSpan("4", context, resource=first, instrumentation_scope=other_scope),
        ReadableSpan("5", context, resource=other, instrumentation_scope=None),
        ReadableSpan(
            "6",
            context,
            resource=first,
            instrumentation_scope=scope,
            events=[Event("e", {"x": 1}, timestamp=5)],
            start_time=0,
            end_time=9,
        ),
    ]
    sent = ExportTraceServiceRequest()
    sent.ParseFromString(_assert_same(spans))
    assert len(sent.resource_spans) == 2
    assert [s.name for s in sent.resource_spans[0].scope_spans[0].spans] == ["1", "3", "6"]
    assert _assert_same([]) == b""


@pytest.mark.parametrize(
    "value",
    [
        2**63,  # outside int64: the official encoder logs it and drops the attribute
        -(2**63) - 1,
        "\ud800",  # not valid UTF-8: likewise
        Color.RED,  # no protobuf type
    ],
)
def test_what_it_does_not_handle_goes_to_the_official_encoder(value: Any) -> None:
    span = ReadableSpan(
        "odd", SpanContext(1, 2, is_remote=False), attributes={"ok": "x", "odd": value}
    )
    assert otlp.encode_spans([span]) is None
    assert otlp.encode_spans([ReadableSpan("plain", SpanContext(1, 2, is_remote=False))])


@pytest.fixture
def collector() -> Iterator[CollectorStub]:
    stub = CollectorStub(keep_bodies=True)
    yield stub
    stub.close()


def test_the_exporter_posts_the_official_bytes(collector: CollectorStub) -> None:
    spans = list(_sdk_spans())
    unhandled = ReadableSpan(
        "odd", SpanContext(1, 2, is_remote=False), attributes={"too.big": 2**64}
    )
    ours, theirs = OTLPExporters(collector.url)
    for batch in (spans, [*spans, unhandled]):
        collector.bodies.clear()
        assert ours.export(batch).name == "SUCCESS"
        assert theirs.export(batch).name == "SUCCESS"
        assert len(collector.bodies) == 2 and collector.bodies[0] == collector.bodies[1]
    # The unhandled batch went out whole, without the attribute the official encoder
    # drops (it logs it).
    sent = ExportTraceServiceRequest()
    sent.ParseFromString(collector.bodies[0])
    names = [s.name for r in sent.resource_spans for ss in r.scope_spans for s in ss.spans]
    assert "odd" in names and len(names) == len(spans) + 1
    ours.shutdown()
    theirs.shutdown()


def OTLPExporters(url: str) -> tuple[otlp.OTLPSpanExporter, OfficialExporter]:
    return otlp.OTLPSpanExporter(endpoint=url), OfficialExporter(endpoint=url)


def test_the_exporter_reports_a_refused_export(collector: CollectorStub) -> None:
    collector.close()  # nothing listens any more: the post fails, not retried
    exporter = otlp.OTLPSpanExporter(endpoint=collector.url, timeout=0.5)
    span = ReadableSpan("x", SpanContext(1, 2, is_remote=False))
    assert exporter.export([span]).name == "FAILURE"
    exporter.shutdown()
    assert exporter.export([span]).name == "FAILURE"  # after shutdown, as the official one


async def test_the_engines_own_spans_encode_as_the_official_encoder(tmp_path: Any) -> None:
    # A booking agent killed in its payment and resumed: run, chat, tool, replayed and
    # failed-attempt spans as agentledger makes them, with the SDK's default resource.
    from agentledger.observe import _tracing as tracing
    from agentledger.records import RunStatus
    from tests.fast.lifecycle_harness import KILLED, Harness
    from tests.observe.apps import Payments, booking_agent_app

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_provider(provider)
    try:
        async with Harness(tmp_path, booking_agent_app(Payments(kill_after_apply=True))) as h:
            run_id = await h.submit("booker", {"message": "book Paris"})
            assert await h.execute(run_id, owner="w1") == KILLED
            assert await h.execute(run_id, owner="w2") == RunStatus.COMPLETED
    finally:
        tracing.set_provider(None)
        provider.shutdown()
    spans = exporter.get_finished_spans()
    names = {s.name for s in spans}
    assert {"invoke_agent booker", "chat scripted-booker", "execute_tool pay"} <= names
    assert any(s.attributes and s.attributes.get("agentledger.step.replayed") for s in spans)
    _assert_same(spans)
