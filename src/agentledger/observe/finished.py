"""Spans handed to the SDK's processors finished, without the SDK's per-span machinery.

A tool attempt's span is known whole when the attempt ends: its parent (the current
span), its name, kind and attributes, its start and end times, its status. Nothing
nests in it and nobody holds it while it is open. The SDK's ``Tracer.start_span`` /
``Span.end`` path costs about 25 us of CPU per span for that (45 us inside the engine):
a lock per call, attributes validated into a ``BoundedAttributes`` twice, a
``BoundedList`` per events and links, a second ``ReadableSpan`` copied at the end.
:class:`SpanMaker` makes the same ``ReadableSpan`` the SDK would hand to its processors
and passes it to the provider's processor's ``on_end``:

- the same sampling decision, asked of the provider's sampler with the same arguments
  (``ParentBased``: the run's root span decided, the attempt follows it), the same ids
  from the provider's id generator, the same trace flags and trace state;
- the same attributes in the same order (the sampler's, then the ending ones); kept as a
  plain dict when every value is a str, bool, int or float and the span limits cannot
  drop or truncate any of them (what ``BoundedAttributes`` would keep unchanged), else
  put through the SDK's ``BoundedAttributes`` with the provider's limits;
- the provider's resource and the tracer's instrumentation scope; the tracer's internal
  metrics (``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``) told of the span as the SDK
  tells them.

It is used only where that is all the SDK would do: an SDK ``TracerProvider`` and
``Tracer`` (not a subclass) whose processors are all the SDK's ``BatchSpanProcessor`` or
``SimpleSpanProcessor`` or agentledger's
:class:`~agentledger.observe.encoded.EncodingSpanProcessor` (their ``on_start`` and
``_on_ending`` do nothing), an enabled
tracer, and a valid parent span. Otherwise :func:`maker` returns ``None`` and the caller
starts an SDK span as before. It reads a few private attributes of the SDK's tracer and
processor; an SDK version without them gets ``None`` too.

When every processor is an ``EncodingSpanProcessor`` (what
:func:`agentledger.observe.tracing.otlp_provider` configures), a span with plain
attributes is not even made a ``ReadableSpan`` (nor a ``SpanContext``): its fields are
queued (``emit_fields``), and the processor's thread encodes them
(:func:`agentledger.observe.otlp.span_message`, the bytes the official encoder writes for
that ``ReadableSpan``); an unsampled (record-only) span is not queued, as ``on_end``
would not queue it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import (
    ReadableSpan,
    SynchronousMultiSpanProcessor,
    Tracer,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
)
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

__all__ = ["DROPPED", "Pending", "SpanMaker", "maker"]

_PROCESSORS = (BatchSpanProcessor, SimpleSpanProcessor)
_PLAIN = frozenset((str, bool, int, float))
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_RANDOM = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)
_UNSET = Status(StatusCode.UNSET)
_time_ns = time.time_ns
_get_current_span = trace.get_current_span


def _noop() -> None:
    return None


def _encoding_type() -> type | None:
    """agentledger's :class:`~agentledger.observe.encoded.EncodingSpanProcessor`, if its
    module is loaded (only then can a provider have one; loading it needs the OTLP
    exporter, an optional dependency)."""
    module = sys.modules.get("agentledger.observe.encoded")
    return getattr(module, "EncodingSpanProcessor", None)


# A sampling decision with what follows from it: (decision, recording, sampled flags).
_Decided = tuple[Decision, bool, TraceFlags]


def _decided(decision: Decision) -> _Decided:
    return (decision, decision.is_recording(), _SAMPLED if decision.is_sampled() else _NOT_SAMPLED)


def _follow(sampler: Any) -> tuple[tuple[_Decided, _Decided], tuple[_Decided, _Decided]] | None:
    """For a ``ParentBased`` sampler whose four parent delegates are the SDK's
    ``ALWAYS_ON`` / ``ALWAYS_OFF``: the decision by [parent is remote][parent sampled]
    (the root delegate is never asked for a child), with whether it records and the
    flags it gives. None for any other sampler, which is then asked span by span."""
    if type(sampler) not in (ParentBased, ParentBasedTraceIdRatio):
        return None
    decisions = {id(ALWAYS_ON): Decision.RECORD_AND_SAMPLE, id(ALWAYS_OFF): Decision.DROP}
    try:
        delegates = (
            (sampler._local_parent_not_sampled, sampler._local_parent_sampled),
            (sampler._remote_parent_not_sampled, sampler._remote_parent_sampled),
        )
    except AttributeError:
        return None
    if any(id(d) not in decisions for pair in delegates for d in pair):
        return None
    local, remote = (tuple(_decided(decisions[id(d)]) for d in pair) for pair in delegates)
    return (local, remote)  # type: ignore[return-value]


class SpanMaker:
    """Finished spans for one SDK tracer (see the module's docstring)."""

    __slots__ = (
        "_active",
        "_encoders",
        "_follow",
        "_limits",
        "_metrics",
        "_processors",
        "_sampler",
        "_tracer",
        "_unbounded",
    )

    def __init__(self, tracer: Tracer, active: SynchronousMultiSpanProcessor) -> None:
        self._tracer = tracer
        self._active = active
        self._processors = active._span_processors
        # When every processor is an EncodingSpanProcessor: a span with plain attributes
        # is queued as its fields, no ReadableSpan made (None: on_end of a ReadableSpan).
        encoding = _encoding_type()
        self._encoders: tuple[Any, ...] | None = None
        if encoding is not None and all(type(p) is encoding for p in self._processors):
            self._encoders = tuple(self._processors)
        self._limits = tracer._span_limits
        metrics = tracer._tracer_metrics
        # The SDK's internal metrics, when switched on (off: nothing to tell them).
        self._metrics = None if type(metrics).__name__ == "NoOpTracerMetrics" else metrics
        self._sampler = tracer.sampler
        self._follow = _follow(tracer.sampler)
        # How many attributes a span keeps unchanged (None: no count limit), or -1 when
        # string values may be truncated (then every span goes through BoundedAttributes).
        if self._limits.max_span_attribute_length is not None:
            self._unbounded = -1
        else:
            count = self._limits.max_span_attributes
            self._unbounded = count if count is not None else 1 << 30

    def usable(self) -> bool:
        """Still only what the SDK would do: the same processors, the tracer enabled."""
        return self._active._span_processors is self._processors and self._tracer._is_enabled()

    def start(
        self, name: str, attributes: dict[str, Any], kind: SpanKind = SpanKind.INTERNAL
    ) -> Pending | None:
        """A span starting now under the current span (:data:`DROPPED` when the sampler
        leaves it out: the SDK would make a non-recording span), or None when only the
        SDK's own path applies (no valid parent, or the provider's configuration changed):
        the caller then starts an SDK span. The span keeps ``attributes`` (a fresh
        dict, not used by the caller after this) and adds the ending ones to it."""
        parent = _get_current_span().get_span_context()
        if not parent.is_valid or not self.usable():
            return None
        tracer = self._tracer
        trace_id = parent.trace_id
        parent_flags = parent.trace_flags
        follow = self._follow
        if follow is not None and tracer.sampler is self._sampler:
            # What the ParentBased sampler returns for a valid parent when the delegate
            # for that parent is ALWAYS_ON / ALWAYS_OFF: the parent's decision, the
            # attributes as given, the parent's trace state.
            decision, recording, flags = follow[parent.is_remote][parent_flags & 1]
            initial: Any = attributes
            state: Any = parent.trace_state
        else:
            result = tracer.sampler.should_sample(None, trace_id, name, kind, attributes, ())
            decision, state = result.decision, result.trace_state
            initial = dict(result.attributes or {})  # the sampler's mapping: a copy to finish
            _, recording, flags = _decided(decision)
        metrics = self._metrics
        end_metrics = _noop if metrics is None else metrics.start_span(parent, decision)
        if not recording:
            return DROPPED
        if _RANDOM and parent_flags & _RANDOM:
            flags = TraceFlags(flags | _RANDOM)
        span_id = tracer.id_generator.generate_span_id()
        return Pending(
            self, name, kind, trace_id, span_id, flags, state, parent, initial, end_metrics
        )

    def finish(
        self,
        pending: Pending,
        ending: dict[str, Any],
        status: Status | None,
        end_time: int,
    ) -> None:
        """Hand ``pending``, ended now with ``ending`` attributes, to the processors."""
        attributes: Any = pending.attributes  # a dict of our own (see start)
        attributes.update(ending)
        plain = len(attributes) <= self._unbounded and _PLAIN.issuperset(
            map(type, attributes.values())
        )
        if plain and self._encoders is not None:
            self._queue_fields(pending, attributes, status, end_time)
            return
        if not plain:
            limits = self._limits
            attributes = BoundedAttributes(
                limits.max_span_attributes,
                attributes,
                immutable=True,
                max_value_len=limits.max_span_attribute_length,
            )
        tracer = self._tracer
        span = ReadableSpan(
            name=pending.name,
            context=pending.context,
            parent=pending.parent,
            resource=tracer.resource,
            attributes=attributes,
            kind=pending.kind,
            instrumentation_info=tracer.instrumentation_info,
            start_time=pending.start_time,
            end_time=end_time,
            instrumentation_scope=tracer._instrumentation_scope,
            status=_UNSET if status is None else status,
        )
        if pending.end_metrics is not _noop:
            pending.end_metrics()
        self._active.on_end(span)

    def _queue_fields(
        self, pending: Pending, attributes: dict[str, Any], status: Status | None, end_time: int
    ) -> None:
        """Queue ``pending``'s fields in every processor (all
        :class:`~agentledger.observe.encoded.EncodingSpanProcessor`), to be encoded by the
        processor's thread: what ``on_end`` of its ``ReadableSpan`` would queue. An
        unsampled (record-only) span is not queued, as ``on_end`` would not queue it."""
        if pending.flags & 1:
            tracer = self._tracer
            resource, scope = tracer.resource, tracer._instrumentation_scope
            for processor in self._encoders or ():
                processor.emit_fields(
                    resource,
                    scope,
                    pending.trace_id,
                    pending.span_id,
                    pending.state,
                    pending.parent,
                    pending.name,
                    pending.kind,
                    pending.start_time,
                    end_time,
                    attributes,
                    status,
                )
        if pending.end_metrics is not _noop:
            pending.end_metrics()


class Pending:
    """A span started by :meth:`SpanMaker.start`, not yet handed to the processors."""

    __slots__ = (
        "attributes",
        "end_metrics",
        "flags",
        "kind",
        "maker",
        "name",
        "parent",
        "span_id",
        "start_time",
        "state",
        "trace_id",
    )

    def __init__(
        self,
        maker: SpanMaker,
        name: str,
        kind: SpanKind,
        trace_id: int,
        span_id: int,
        flags: TraceFlags,
        state: Any,
        parent: SpanContext,
        attributes: Any,
        end_metrics: Any,
    ) -> None:
        self.maker = maker
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = span_id
        self.flags = flags
        self.state = state
        self.parent = parent
        self.attributes = attributes
        self.end_metrics = end_metrics
        self.start_time = _time_ns()

    @property
    def context(self) -> SpanContext:
        """The span's context, made only for a ``ReadableSpan`` (a span queued by its
        fields needs only its ids, flags and trace state)."""
        return SpanContext(
            self.trace_id,
            self.span_id,
            is_remote=False,
            trace_flags=self.flags,
            trace_state=self.state,
        )

    def end(self, ending: dict[str, Any], status: Status | None = None) -> None:
        """End the span now with ``ending`` attributes (and ``status``, if any)."""
        self.maker.finish(self, ending, status, _time_ns())


class _Dropped(Pending):
    """A span the sampler left out: ending it does nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def end(self, ending: dict[str, Any], status: Status | None = None) -> None:
        return None


#: What :meth:`SpanMaker.start` returns for a span the sampler left out.
DROPPED: Pending = _Dropped()


def maker(provider: Any, tracer: Any) -> SpanMaker | None:
    """A :class:`SpanMaker` for ``tracer`` of ``provider``, or None where only the SDK's
    own span path does what the provider's configuration asks."""
    if type(provider) is not TracerProvider or type(tracer) is not Tracer:
        return None
    try:
        active = provider._active_span_processor
        if type(active) is not SynchronousMultiSpanProcessor or tracer.span_processor is not active:
            return None
        known = (*_PROCESSORS, _encoding_type())
        if not all(type(p) in known for p in active._span_processors):
            return None
        made = SpanMaker(tracer, active)
        made.usable()  # every private attribute it reads is there
    except AttributeError:
        return None
    return made
