"""OTLP/HTTP span export with a faster encoder of the same bytes.

The official encoder (``opentelemetry.exporter.otlp.proto.common``) builds one protobuf
object per span, per attribute and per attribute value, and hashes the span's
``Resource`` (a JSON dump of its attributes) once per span to group the batch: about
40 us of CPU per span, on the batch processor's thread but holding the GIL, so a busy
worker's event loop waits for it. :func:`encode_spans` writes the same
``ExportTraceServiceRequest`` directly in protobuf's wire format: the same bytes as
``encode_spans(spans).SerializePartialToString()`` of the official encoder (the tests
compare both, byte for byte and decoded, over every attribute type, events, links,
status, parents and trace state). What it does not handle exactly -- an attribute value
of a type the official encoder would convert or drop, an integer outside int64, a string
that is not valid UTF-8 -- makes it return ``None``, and the whole batch goes through the
official encoder instead.

:class:`OTLPSpanExporter` is the official OTLP/HTTP exporter (endpoint, headers, TLS,
compression, retries, size limit, all from the same settings) with only the encoding
replaced. It relies on three private attributes of the official exporter; when an
installed version lacks them it exports exactly as the official one does.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as _OfficialExporter,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as _PB2Span
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags as _PB2SpanFlags
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE
from opentelemetry.trace import DEFAULT_TRACE_STATE, Link, SpanKind, Status, StatusCode

try:  # the official encoder's own functions for the resource and the scope (once a batch)
    from opentelemetry.exporter.otlp.proto.common._internal import (
        _encode_instrumentation_scope,
        _encode_resource,
    )
except ImportError:  # pragma: no cover - another layout: the official encoder does it all
    _encode_resource = None  # type: ignore[assignment]
try:  # what the official exporter reports for a request over its size limit
    from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError
except ImportError:  # pragma: no cover - another version: its own export does everything
    RequestPayloadTooLargeError = None  # type: ignore[assignment,misc]

__all__ = [
    "KIND_VALUE",
    "UNSET",
    "OTLPSpanExporter",
    "encode_request",
    "encode_spans",
    "span_bytes",
    "span_fields",
    "span_message",
    "trace_state_text",
]

# The official exporter's logger: what export_encoded logs comes from the same place.
_logger = logging.getLogger(_OfficialExporter.__module__)

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_pack_times = struct.Struct("<BQBQ").pack  # a span's start and end, with their tags
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# Small varints (lengths of keys, values, attributes and spans) from a table.
_VARINTS = [bytes((n,)) if n < 0x80 else b"" for n in range(0x4000)]


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


for _n in range(0x80, 0x4000):
    _VARINTS[_n] = _varint_slow(_n)


def _varint(n: int) -> bytes:
    return _VARINTS[n] if n < 0x4000 else _varint_slow(n)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    n = len(payload)
    return tag + (_VARINTS[n] if n < 0x4000 else _varint_slow(n)) + payload


# The OTLP enum of each span kind, taken from the official encoder's protobuf classes.
_KIND = {
    SpanKind.INTERNAL: _varint(_PB2Span.SpanKind.SPAN_KIND_INTERNAL),
    SpanKind.SERVER: _varint(_PB2Span.SpanKind.SPAN_KIND_SERVER),
    SpanKind.CLIENT: _varint(_PB2Span.SpanKind.SPAN_KIND_CLIENT),
    SpanKind.PRODUCER: _varint(_PB2Span.SpanKind.SPAN_KIND_PRODUCER),
    SpanKind.CONSUMER: _varint(_PB2Span.SpanKind.SPAN_KIND_CONSUMER),
}
_HAS_IS_REMOTE = _PB2SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = _PB2SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_FLAGS_LOCAL = b"\x85\x01" + _pack_fixed32(_HAS_IS_REMOTE)  # Span.flags: field 16, fixed32
_FLAGS_REMOTE = b"\x85\x01" + _pack_fixed32(_HAS_IS_REMOTE | _IS_REMOTE)


class _Unsupported(Exception):
    """Something the official encoder would treat otherwise: it encodes the batch."""


# Encoded span attribute fields (tag, length, ``KeyValue``) of string and boolean values
# by (key, value): a span's constant attributes (operation, tool name, effect, run id,
# outcome) repeat from span to span. Bounded: emptied when full, so unique values (call
# ids) cannot make it grow. Only str and bool values are keys (True == 1 never meets an
# int here).
_ATTRS: dict[tuple[str, Any], bytes] = {}
_ATTRS_MAX = 4096
# The same for int values (a dict of their own: True == 1 must not find an int's bytes).
_INTS: dict[tuple[str, int], bytes] = {}
# The encoded key field (tag, length, UTF-8) of each attribute key seen.
_KEYS: dict[str, bytes] = {}
_KEYS_MAX = 4096


def _key_field(key: str) -> bytes:
    found = _KEYS.get(key)
    if found is None:
        if type(key) is not str:
            raise _Unsupported
        found = _field(b"\x0a", key.encode()) if key else b""  # proto3: "" is not sent
        if len(_KEYS) >= _KEYS_MAX:
            _KEYS.clear()
        _KEYS[key] = found
    return found


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message, as the official ``_encode_value`` builds it."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", str.encode(value))
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Unsupported  # the official encoder logs it and drops the attribute
        return b"\x18" + _varint_slow(int(value) & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", bytes(value))
    if isinstance(value, Sequence):
        array = b"".join([_field(b"\x0a", _any_value(v)) for v in value])
        return _field(b"\x2a", array)
    if isinstance(value, Mapping):
        pairs = b"".join([_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()])
        return _field(b"\x32", pairs)
    raise _Unsupported


def _key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message (without its own tag)."""
    return _key_field(key) + _field(b"\x12", _any_value(value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated ``KeyValue`` fields under ``tag``."""
    if not attributes:
        return b""
    return b"".join([_field(tag, _key_value(k, v)) for k, v in attributes.items()])


def _events(events: Sequence[Event]) -> bytes:
    out = []
    for event in events:
        parts = []
        if event.timestamp:
            parts.append(b"\x09" + _pack_fixed64(event.timestamp))
        if event.name:
            parts.append(_field(b"\x12", event.name.encode()))
        parts.append(_attributes(b"\x1a", event.attributes))
        if event.dropped_attributes:
            parts.append(b"\x20" + _varint(event.dropped_attributes))
        out.append(_field(b"\x5a", b"".join(parts)))
    return b"".join(out)


def _links(links: Sequence[Link]) -> bytes:
    out = []
    for link in links:
        context = link.context
        parts = [
            _field(b"\x0a", _trace_id(context.trace_id)),
            _field(b"\x12", _span_id(context.span_id)),
            _attributes(b"\x22", link.attributes),
        ]
        if link.dropped_attributes:
            parts.append(b"\x28" + _varint(link.dropped_attributes))
        flags = _HAS_IS_REMOTE | (_IS_REMOTE if context.is_remote else 0)
        parts.append(b"\x35" + _pack_fixed32(flags))
        out.append(_field(b"\x6a", b"".join(parts)))
    return b"".join(out)


def _trace_id(trace_id: int) -> bytes:
    return trace_id.to_bytes(length=16, byteorder="big", signed=False)


def _span_id(span_id: int) -> bytes:
    return span_id.to_bytes(length=8, byteorder="big", signed=False)


def _span(span: ReadableSpan) -> bytes:
    """One ``Span`` message, as the ``ScopeSpans.spans`` field (tag, length, message)."""
    if type(span) is ReadableSpan:
        # What the SDK hands to exporters (and what agentledger's finished spans are):
        # read its fields, not its properties, which copy the attributes into a proxy,
        # the events and links into tuples, and test three containers' types.
        context = span._context
        if context is None:
            raise _Unsupported
        return span_message(
            context.trace_id,
            context.span_id,
            context.trace_state,
            span._parent,
            span._name,
            span._kind,
            span._start_time,
            span._end_time,
            span._attributes,
            span._status,
            span._events,
            span._links,
            span,
        )
    context = span.get_span_context()
    if context is None:
        raise _Unsupported
    return span_message(
        context.trace_id,
        context.span_id,
        context.trace_state,
        span.parent,
        span.name,
        span.kind,
        span.start_time,
        span.end_time,
        span.attributes,
        span.status,
        span.events,
        span.links,
        span,
    )


def span_message(
    trace_id: int,
    span_id: int,
    state: Any,
    parent: Any,
    name: str,
    kind: SpanKind,
    start: int | None,
    end: int | None,
    attributes: Mapping[str, Any] | None,
    status: Status | None,
    events: Sequence[Event] = (),
    links: Sequence[Link] = (),
    span: ReadableSpan | None = None,
) -> bytes:
    """One ``Span`` message from its fields, as the ``ScopeSpans.spans`` field (tag,
    length, message; fields in number order, as protobuf serializes them): the bytes the
    official encoder writes for a ``ReadableSpan`` of these fields. ``span`` says how
    many attributes, events and links were dropped (None: a plain dict of attributes
    and tuples of events and links, nothing dropped). Raises an internal exception for
    what this encoder does not handle (see :func:`span_bytes`)."""
    if status is None:
        code, description = None, None
    elif status is UNSET:
        code, description = 0, None
    else:
        code, description = status.status_code.value, status.description
    return span_fields(
        trace_id,
        span_id,
        trace_state_text(state),
        parent.span_id if parent else None,
        bool(parent) and parent.is_remote,
        name,
        KIND_VALUE[id(kind)],
        start,
        end,
        attributes,
        code,
        description,
        events,
        links,
        span,
    )


def trace_state_text(state: Any) -> str:
    """A trace state as the official encoder writes it ("" for none or empty)."""
    if state is None or state is _NO_STATE or not state:
        return ""
    return ",".join([f"{key}={value}" for key, value in state.items()])


def span_fields(
    trace_id: int,
    span_id: int,
    state: str,
    parent_id: int | None,
    remote: bool,
    name: str,
    kind: int,
    start: int | None,
    end: int | None,
    attributes: Mapping[str, Any] | tuple[Any, ...] | None,
    code: int | None,
    description: str | None,
    events: Sequence[Event] = (),
    links: Sequence[Link] = (),
    span: ReadableSpan | None = None,
) -> bytes:
    """:func:`span_message` of fields the garbage collector does not track: the trace
    state's text (:func:`trace_state_text`), the parent's span id (None: no parent) and
    whether it is remote, the ``SpanKind`` value, the attributes (a mapping, or a
    flat tuple: key, value, key, value...), the ``StatusCode`` value (None: no status) and
    description."""
    # A run's spans share its trace id and mostly one parent (the run's span): their
    # encodings are kept from the previous span (one tuple each, replaced whole, so a
    # thread reads a consistent pair).
    ids = _LAST_TRACE
    if ids[0] != trace_id:
        ids = _remember_trace(trace_id)
    parts = [ids[1] + span_id.to_bytes(8, "big")]
    append = parts.append
    if state:
        append(_field(b"\x1a", state.encode()))
    if parent_id is not None:
        known = _LAST_PARENT
        if known[0] != parent_id:
            known = _remember_parent(parent_id)
        append(known[1])
    if name:
        append(_field(b"\x2a", name.encode()))
    append(_KIND_FIELDS[kind])
    if start and end:
        append(_pack_times(0x39, start, 0x41, end))
    else:
        if start:
            append(b"\x39" + _pack_fixed64(start))
        if end:
            append(b"\x41" + _pack_fixed64(end))
    if attributes:
        if type(attributes) is tuple:  # key, value, key, value...
            pairs: Any = zip(attributes[::2], attributes[1::2], strict=True)
        else:
            pairs = attributes.items()  # type: ignore[union-attr]
        for key, value in pairs:
            vtype = type(value)
            cache = _ATTRS if vtype is str or vtype is bool else _INTS if vtype is int else None
            if cache is None:
                append(_field(b"\x4a", _key_value(key, value)))
                continue
            found = cache.get((key, value))
            if found is None:
                found = _field(b"\x4a", _key_value(key, value))
                if len(cache) >= _ATTRS_MAX:
                    cache.clear()
                cache[(key, value)] = found
            append(found)
    # Dropped counts: a plain dict / tuple (a finished span's) drops nothing; the SDK's
    # bounded containers say what they dropped.
    dropped = 0 if span is None or type(attributes) is dict else span.dropped_attributes
    if dropped:
        append(b"\x50" + _varint(dropped))
    if events:
        append(_events(events))
    dropped = 0 if span is None or type(events) is tuple else span.dropped_events
    if dropped:
        append(b"\x60" + _varint(dropped))
    if links:
        append(_links(links))
    dropped = 0 if span is None or type(links) is tuple else span.dropped_links
    if dropped:
        append(b"\x70" + _varint(dropped))
    if code is not None:
        if not code and not description:
            append(b"\x7a\x00")  # present, empty: as the official encoder sends it
        else:
            text = _field(b"\x12", description.encode()) if description else b""
            append(_field(b"\x7a", text + b"\x18" + _varint(code) if code else text))
    append(_FLAGS_REMOTE if remote else _FLAGS_LOCAL)
    return _field(b"\x12", b"".join(parts))  # ScopeSpans.spans: field 2


#: The unset status (no code, no description): encoded without reading it.
UNSET = Status(StatusCode.UNSET)
_NO_STATE = DEFAULT_TRACE_STATE
#: Each ``SpanKind``'s value by the member's id (an enum's ``value`` is a property).
KIND_VALUE = {id(kind): kind.value for kind in SpanKind}
_KIND_FIELDS = [b"\x30" + _KIND[kind] for kind in sorted(SpanKind, key=lambda k: k.value)]
_LAST_TRACE: tuple[int, bytes] = (-1, b"")
_LAST_PARENT: tuple[int, bytes] = (-1, b"")


def _remember_trace(trace_id: int) -> tuple[int, bytes]:
    """The trace id's field and the span id's tag (what every span starts with)."""
    global _LAST_TRACE
    _LAST_TRACE = (trace_id, b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08")
    return _LAST_TRACE


def _remember_parent(parent_id: int) -> tuple[int, bytes]:
    """The parent span id's field."""
    global _LAST_PARENT
    _LAST_PARENT = (parent_id, b"\x22\x08" + parent_id.to_bytes(8, "big"))
    return _LAST_PARENT


#: What :func:`span_message` raises for what only the official encoder handles.
ENCODE_ERRORS = (_Unsupported, KeyError, OverflowError, UnicodeError, AttributeError, TypeError)


def span_bytes(span: ReadableSpan) -> bytes:
    """One span's ``ScopeSpans.spans`` field: what the official encoder writes for it in
    a batch (a repeated message field is each message's tag, length and bytes, so a
    batch's spans are the concatenation of these). By :func:`span_message` where it
    handles the span, else by the official encoder, which also logs and drops what it
    cannot send (an integer outside int64, a string that is not UTF-8)."""
    try:
        return _span(span)
    except ENCODE_ERRORS:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        request = encode_spans([span])
        message = request.resource_spans[0].scope_spans[0].spans[0]
        return _field(b"\x12", message.SerializePartialToString())


def encode_request(groups: Mapping[Any, Mapping[Any, Sequence[bytes]]]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of encoded spans (each as
    :func:`span_bytes` makes it) grouped by resource, then by instrumentation scope."""
    resource_spans = []
    for resource, scopes in groups.items():
        parts = [_field(b"\x0a", _encode_resource(resource).SerializePartialToString())]
        for scope, encoded in scopes.items():
            scope_message = _encode_instrumentation_scope(scope)
            scope_parts = [_field(b"\x0a", scope_message.SerializePartialToString()), *encoded]
            schema = scope.schema_url if scope else None
            if schema:
                scope_parts.append(_field(b"\x1a", schema.encode()))
            parts.append(_field(b"\x12", b"".join(scope_parts)))
        if resource.schema_url:
            parts.append(_field(b"\x1a", resource.schema_url.encode()))
        resource_spans.append(_field(b"\x0a", b"".join(parts)))
    return b"".join(resource_spans)


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes | None:
    """The serialized ``ExportTraceServiceRequest`` of ``spans``, byte for byte what
    the official encoder makes, or ``None`` when the batch has something this encoder
    does not handle (the caller then uses the official encoder)."""
    # Grouped by resource, then instrumentation scope, in order of first appearance and
    # by equality as the official encoder's dictionaries group them; a run of spans of
    # the same objects (the common case: one provider) is grouped without hashing.
    if _encode_resource is None:  # pragma: no cover
        return None
    groups: dict[Any, dict[Any, list[bytes]]] = {}
    last_resource: Any = None
    last_scope: Any = None
    current: list[bytes] | None = None
    try:
        for span in spans:
            if type(span) is ReadableSpan:  # its fields, as in _span
                resource, scope = span._resource, span._instrumentation_scope or None
            else:
                resource, scope = span.resource, span.instrumentation_scope or None
            if current is None or resource is not last_resource or scope is not last_scope:
                current = groups.setdefault(resource, {}).setdefault(scope, [])
                last_resource, last_scope = resource, scope
            current.append(_span(span))
        return encode_request(groups)
    except ENCODE_ERRORS:
        return None


class OTLPSpanExporter(_OfficialExporter):
    """The official OTLP/HTTP span exporter, encoding with :func:`encode_spans`.

    Same constructor, settings and behaviour; a batch the fast encoder does not handle,
    one over the size limit, and every batch on an exporter version whose internals
    differ from what this relies on go through the official ``export`` unchanged.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The official export's steps, reused: its HTTP client (retries, compression,
        # headers), its own metrics, its size limit.
        client = getattr(self, "_client", None)
        metrics = getattr(self, "_metrics", None)
        self._encoded = (
            callable(getattr(client, "export", None))
            and callable(getattr(metrics, "export_operation", None))
            and isinstance(getattr(self, "_max_request_size", None), int)
            and isinstance(getattr(self, "_shutdown", None), bool)
            and RequestPayloadTooLargeError is not None
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export ``spans`` (see the class docstring)."""
        if not self._encoded or self._shutdown:
            return super().export(spans)
        body = encode_spans(spans)
        limit = self._max_request_size
        if body is None or 0 < limit < len(body):
            return super().export(spans)  # it logs, counts and refuses as it does
        return self._post(body, len(spans))

    @property
    def encoded(self) -> bool:
        """True when :meth:`export_encoded` posts through the official exporter's own
        steps (this exporter version has the internals it reuses)."""
        return bool(self._encoded)

    def export_encoded(self, body: bytes, count: int) -> SpanExportResult:
        """Post ``body``, a serialized ``ExportTraceServiceRequest`` of ``count`` spans,
        as the official ``export`` posts its own encoding of them: refused after shutdown
        and over the size limit (logged and counted as it does), else sent through its
        HTTP client and counted in its metrics. Only when :attr:`encoded`."""
        if self._shutdown:
            _logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE
        limit = self._max_request_size
        if 0 < limit < len(body):
            with self._metrics.export_operation(count) as result:
                _logger.warning(
                    "Dropping span batch: serialized size %d bytes exceeds max_request_size "
                    "%d bytes.",
                    len(body),
                    limit,
                )
                result.error = RequestPayloadTooLargeError(
                    f"Serialized span request size {len(body)} bytes exceeds "
                    f"max_request_size {limit} bytes."
                )
                return SpanExportResult.FAILURE
        return self._post(body, count)

    def _post(self, body: bytes, count: int) -> SpanExportResult:
        with self._metrics.export_operation(count) as result:
            sent = self._client.export(body)
            if not sent.success:
                result.error = sent.error
                result.error_attrs = (
                    {HTTP_RESPONSE_STATUS_CODE: sent.status_code}
                    if sent.status_code is not None
                    else None
                )
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
