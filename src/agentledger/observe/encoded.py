"""A batch span processor that queues each span encoded, not the span object.

The SDK's ``BatchSpanProcessor`` keeps every ended span (a ``ReadableSpan`` with its
context, attributes, status, resource: a dozen GC-tracked objects) in its queue until its
thread exports the batch, up to its schedule delay (5 s by default) later. On a busy
worker those objects live long enough to be promoted to the oldest generation, and full
collections of a large heap come more often. :class:`EncodingSpanProcessor` queues what
the collector does not keep track of:

- a span ended through the SDK (a run's span, a workflow's ``step`` span) is encoded to
  its OTLP ``Span`` message bytes when it ends (:func:`agentledger.observe.otlp.
  span_bytes`, the bytes the official encoder writes) and the bytes are queued;
- a span made finished (:mod:`agentledger.observe.finished`: tool and model attempts,
  replayed steps) is never made a ``ReadableSpan``: its fields are queued as one tuple
  of ints, strings and other plain values, the attributes flattened into it (the
  parent as its span id)
  (:meth:`EncodingSpanProcessor.emit_fields`; the collector untracks such a tuple at
  its first collection), and the processor's thread encodes them
  (:func:`agentledger.observe.otlp.span_fields`), off the worker's event loop.

A batch request is the concatenation of the spans' bytes inside its ``ResourceSpans`` /
``ScopeSpans``, byte for byte the official encoder's request for the same spans, posted
by the OTLP exporter's own client (:meth:`agentledger.observe.otlp.OTLPSpanExporter.
export_encoded`: its retries, compression, headers, size limit and metrics).

Everything else is the SDK's ``BatchSpanProcessor``, which this class is: its queue (the
SDK's ``BatchProcessor``: maximum queue size with dropped spans logged and counted, batch
size, schedule delay, export on a full batch, ``force_flush``, ``shutdown`` flushing
then shutting the exporter down, a new thread and an empty queue after ``fork``), its
settings and their ``OTEL_BSP_*`` environment variables, its internal metrics. Only a
sampled span is queued, as there. It is used by
:func:`agentledger.observe.tracing.otlp_provider` when the installed SDK and exporter
have the internals it relies on (:func:`encoding_processor`); otherwise that provider
gets the SDK's processor and exporter as before.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from itertools import chain
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from agentledger.observe.otlp import (
    ENCODE_ERRORS,
    KIND_VALUE,
    OTLPSpanExporter,
    encode_request,
    span_bytes,
    span_fields,
    trace_state_text,
)

try:  # the SDK's batch queue behind BatchSpanProcessor, which this processor feeds
    from opentelemetry.sdk._shared_internal import BatchProcessor

    # This SDK's BatchSpanProcessor queues into one (its _batch_processor).
    _QUEUE = callable(getattr(BatchProcessor, "emit", None)) and (
        "_batch_processor" in BatchSpanProcessor.__init__.__code__.co_names
    )
except ImportError:  # pragma: no cover - another SDK layout: the SDK's processor
    _QUEUE = False

__all__ = ["EncodingSpanProcessor", "encoding_processor"]

# A queued span: its encoded bytes when it belongs to the processor's first (resource,
# scope) group (nearly always: one provider, agentledger's tracer), else the group's
# index and the bytes (a tuple of untracked objects: the collector untracks it); or a
# finished span's fields, the group's index first (see emit_fields).
Queued = bytes | tuple[Any, ...]
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_flatten = chain.from_iterable


class _Groups:
    """The (resource, instrumentation scope) pairs of the queued spans, by index.

    Looked up by identity (a ``Resource`` hashes a JSON dump of its attributes); the
    batch merges equal ones as the official encoder groups them. A pair is kept for
    the processor's lifetime: a provider has one resource and few tracers.
    """

    def __init__(self) -> None:
        self.pairs: list[tuple[Resource, InstrumentationScope | None]] = []
        self._index: dict[tuple[int, int], int] = {}
        self._first: tuple[Any, Any] = (object(), object())
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):  # a child never waits for a parent's thread
            reset = weakref.WeakMethod(self._at_fork_reinit)
            os.register_at_fork(after_in_child=lambda: (method := reset()) and method())

    def _at_fork_reinit(self) -> None:
        self._lock = threading.Lock()

    def queued(self, resource: Resource, scope: InstrumentationScope | None, body: bytes) -> Queued:
        """What the queue holds for ``body``, a span of ``resource`` and ``scope``."""
        index = self.index(resource, scope)
        return body if index == 0 else (index, body)

    def index(self, resource: Resource, scope: InstrumentationScope | None) -> int:
        """The index of the (``resource``, ``scope``) pair."""
        first = self._first
        if first[0] is resource and first[1] is scope:
            return 0
        index = self._index.get((id(resource), id(scope)))
        if index is None:
            with self._lock:
                index = self._index.get((id(resource), id(scope)))
                if index is None:
                    index = len(self.pairs)
                    self.pairs.append((resource, scope))  # kept alive: its id stays its own
                    self._index[(id(resource), id(scope))] = index
                    if index == 0:
                        self._first = (resource, scope)
        return index


class _RequestExporter(SpanExporter):
    """What the SDK's batch queue exports to: a batch of queued bytes becomes one
    request, posted by the OTLP exporter."""

    def __init__(self, exporter: OTLPSpanExporter, groups: _Groups) -> None:
        self.exporter = exporter
        self._groups = groups

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        pairs = self._groups.pairs
        grouped: dict[Any, dict[Any, list[bytes]]] = {}
        last = -1
        current: list[bytes] = []
        for item in spans:
            if type(item) is bytes:
                index, body = 0, item
            elif len(item) == 2:  # (index, bytes): a fields tuple has 12 or more
                index, body = item
            else:
                index, body = item[0], self._fields(item)
            if index != last:
                resource, scope = pairs[index]
                current = grouped.setdefault(resource, {}).setdefault(scope, [])
                last = index
            current.append(body)
        return self.exporter.export_encoded(encode_request(grouped), len(spans))

    def _fields(self, item: tuple[Any, ...]) -> bytes:
        """A finished span's encoding from its queued fields (see ``emit_fields``)."""
        index, trace_id, span_id, state, parent_id, remote, name, kind = item[:8]
        start, end, code, description = item[8:12]
        attributes = item[12:]
        try:
            return span_fields(
                trace_id,
                span_id,
                state,
                parent_id,
                remote,
                name,
                kind,
                start,
                end,
                attributes,
                code,
                description,
            )
        except ENCODE_ERRORS:  # the official encoder's, for the ReadableSpan it stands for
            resource, scope = self._groups.pairs[index]
            span = ReadableSpan(
                name,
                SpanContext(
                    trace_id,
                    span_id,
                    False,
                    _SAMPLED,
                    TraceState.from_header([state]) if state else None,
                ),
                SpanContext(trace_id, parent_id, remote) if parent_id is not None else None,
                resource=resource,
                attributes=dict(zip(attributes[::2], attributes[1::2], strict=True)),
                kind=SpanKind(kind),
                start_time=start,
                end_time=end,
                instrumentation_scope=scope,
                status=Status(StatusCode(code), description),
            )
            return span_bytes(span)

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class EncodingSpanProcessor(BatchSpanProcessor):
    """The SDK's ``BatchSpanProcessor`` into an :class:`~agentledger.observe.otlp.
    OTLPSpanExporter`, queueing each span's encoded bytes (see the module's docstring).
    Same constructor arguments and environment variables as ``BatchSpanProcessor``;
    make one with :func:`encoding_processor`, which checks the internals it relies on."""

    def __init__(
        self,
        span_exporter: OTLPSpanExporter,
        max_queue_size: int | None = None,
        schedule_delay_millis: float | None = None,
        max_export_batch_size: int | None = None,
        export_timeout_millis: float | None = None,
        **kwargs: Any,
    ) -> None:
        self._groups = _Groups()
        self._otlp = span_exporter
        super().__init__(
            _RequestExporter(span_exporter, self._groups),
            max_queue_size,
            schedule_delay_millis,
            max_export_batch_size,
            export_timeout_millis,
            **kwargs,
        )
        # The SDK's queue takes any item; its annotation says spans.
        self._emit: Any = self._batch_processor.emit

    @property
    def span_exporter(self) -> OTLPSpanExporter:
        """The OTLP exporter the batches are posted with."""
        return self._otlp

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a sampled span's encoded bytes (what the SDK's processor queues the span
        for)."""
        context = span.context
        if not (context and context.trace_flags.sampled):
            return
        self._emit(
            self._groups.queued(span.resource, span.instrumentation_scope or None, span_bytes(span))
        )

    def emit_fields(
        self,
        resource: Resource,
        scope: InstrumentationScope | None,
        trace_id: int,
        span_id: int,
        state: Any,
        parent: SpanContext | None,
        name: str,
        kind: Any,
        start: int,
        end: int,
        attributes: dict[str, Any],
        status: Status | None,
    ) -> None:
        """Queue a sampled, finished span of ``resource`` and instrumentation ``scope``
        by its fields (a ``ReadableSpan`` with these, a plain dict of str, bool, int and
        float attributes, no events nor links), encoded by the processor's thread
        (:func:`agentledger.observe.otlp.span_fields`). The queued tuple holds only
        objects the collector does not track (ints, strings, bools, floats, None; the
        attributes flattened into it): it is untracked at its first collection and never
        reaches an older generation."""
        if status is None:
            code, description = 0, None
        else:
            code, description = status.status_code.value, status.description
        # One flat tuple, the attributes last as key, value, key, value...: a tuple
        # holding a dict or another tuple is untracked only at a later collection (its
        # elements first), by when it may have been promoted.
        self._emit(
            (
                self._groups.index(resource, scope or None),
                trace_id,
                span_id,
                trace_state_text(state),
                parent.span_id if parent is not None else None,
                parent is not None and parent.is_remote,
                name,
                KIND_VALUE[id(kind)],
                start,
                end,
                code,
                description,
                *_flatten(attributes.items()),
            )
        )


def encoding_processor(exporter: OTLPSpanExporter) -> BatchSpanProcessor:
    """An :class:`EncodingSpanProcessor` into ``exporter``, or the SDK's
    ``BatchSpanProcessor`` when this SDK or exporter version lacks what it relies on
    (the SDK's ``BatchProcessor`` with its ``emit``; the exporter's encoded path)."""
    if not (exporter.encoded and _QUEUE):
        return BatchSpanProcessor(exporter)
    return EncodingSpanProcessor(exporter)
