"""An opt-in OTLP/HTTP span exporter with a faster encoder of the same bytes.

The stock pipeline (:func:`agentledger.observe._tracing.otlp_provider`) exports through
the official ``OTLPSpanExporter``, whose encoder builds one protobuf object per span,
per attribute and per attribute value on the batch processor's thread, holding the GIL
while a busy worker's event loop waits for it. :func:`encode_spans` writes the same
``ExportTraceServiceRequest`` directly in protobuf's wire format: the same bytes as
``encode_spans(spans).SerializePartialToString()`` of the official encoder (the tests
compare both, byte for byte and decoded, over every attribute type, events, links,
status, parents, trace state, resources and scopes). What it does not handle exactly --
an attribute value of a type the official encoder would convert or drop, an integer
outside int64, a string that is not valid UTF-8 -- makes it return ``None``, and the
whole batch goes through the official encoder instead.

:class:`OTLPSpanExporter` is the official OTLP/HTTP exporter (endpoint, headers, TLS,
compression, retries, size limit, its own metrics, all from the same settings) with only
the encoding replaced; opt in with ``otlp_provider(fast_encoder=True)``. It posts through
private attributes of the official exporter, so it is used only on the exporter versions
it is tested with (:data:`TESTED_VERSIONS`, the bound on the ``otel`` extra in
pyproject.toml); on any other version, or when those attributes are missing, it exports
exactly as the official exporter does.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as _OfficialExporter,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as _PB2Span
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags as _PB2SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE
from opentelemetry.trace import Link, SpanKind, StatusCode

__all__ = ["TESTED_VERSIONS", "OTLPSpanExporter", "encode_spans", "tested_version"]

#: The ``opentelemetry-exporter-otlp-proto-http`` versions (from, to excluded) whose
#: internals :class:`OTLPSpanExporter` relies on and whose encoder's bytes the tests
#: compare with (1.30 has neither those internals nor the same bytes).
TESTED_VERSIONS = ((1, 45), (1, 46))


def tested_version() -> bool:
    """True when the installed OTLP/HTTP exporter is in :data:`TESTED_VERSIONS`."""
    try:
        installed = metadata.version("opentelemetry-exporter-otlp-proto-http")
        major, minor = (int(part) for part in installed.split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    low, high = TESTED_VERSIONS
    return low <= (major, minor) < high


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
_INTS: dict[tuple[str, Any], bytes] = {}
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
    """One ``Span`` message as the ``ScopeSpans.spans`` field (tag, length, message;
    fields in number order, as protobuf serializes them), read through the span's public
    properties."""
    context = span.get_span_context()
    if context is None:
        raise _Unsupported
    parts = [_trace_span_ids(context.trace_id, context.span_id)]
    append = parts.append
    state = context.trace_state
    if state:
        text = ",".join([f"{key}={value}" for key, value in state.items()])
        append(_field(b"\x1a", text.encode()))
    parent = span.parent
    if parent:
        append(b"\x22\x08" + _span_id(parent.span_id))
    name = span.name
    if name:
        append(_field(b"\x2a", name.encode()))
    append(_KIND_FIELDS[span.kind])
    start, end = span.start_time, span.end_time
    if start and end:
        append(_pack_times(0x39, start, 0x41, end))
    else:
        if start:
            append(b"\x39" + _pack_fixed64(start))
        if end:
            append(b"\x41" + _pack_fixed64(end))
    attributes = span.attributes
    if attributes:
        for key, value in attributes.items():
            vtype = type(value)
            cache: dict[tuple[str, Any], bytes] | None = (
                _ATTRS if vtype is str or vtype is bool else _INTS if vtype is int else None
            )
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
    if span.dropped_attributes:
        append(b"\x50" + _varint(span.dropped_attributes))
    events = span.events
    if events:
        append(_events(events))
    if span.dropped_events:
        append(b"\x60" + _varint(span.dropped_events))
    links = span.links
    if links:
        append(_links(links))
    if span.dropped_links:
        append(b"\x70" + _varint(span.dropped_links))
    status = span.status
    if status is not None:
        code, description = status.status_code, status.description
        if code is StatusCode.UNSET and not description:
            append(b"\x7a\x00")  # present, empty: as the official encoder sends it
        else:
            message = _field(b"\x12", description.encode()) if description else b""
            number = code.value
            append(_field(b"\x7a", message + b"\x18" + _varint(number) if number else message))
    append(_FLAGS_REMOTE if parent and parent.is_remote else _FLAGS_LOCAL)
    return _field(b"\x12", b"".join(parts))  # ScopeSpans.spans: field 2


_KIND_FIELDS = {kind: b"\x30" + _KIND[kind] for kind in SpanKind}
# A run's spans share its trace id: its encoding is kept from the previous span (one
# tuple, replaced whole, so a thread reads a consistent pair).
_LAST_TRACE: tuple[int, bytes] = (-1, b"")


def _trace_span_ids(trace_id: int, span_id: int) -> bytes:
    """The trace id field and the span id field (what every span starts with)."""
    global _LAST_TRACE
    last = _LAST_TRACE
    if last[0] != trace_id:
        last = _LAST_TRACE = (trace_id, b"\x0a\x10" + _trace_id(trace_id) + b"\x12\x08")
    return last[1] + _span_id(span_id)


#: What :func:`_span` raises for what only the official encoder handles.
_ENCODE_ERRORS = (_Unsupported, KeyError, OverflowError, UnicodeError, AttributeError, TypeError)


def _resource(resource: Resource) -> bytes:
    """A ``Resource`` message, as the official encoder builds it (its attributes)."""
    return _attributes(b"\x0a", resource.attributes)


def _scope(scope: InstrumentationScope | None) -> bytes:
    """An ``InstrumentationScope`` message, as the official encoder builds it."""
    if scope is None:
        return b""
    parts = []
    if scope.name:
        parts.append(_field(b"\x0a", scope.name.encode()))
    if scope.version:
        parts.append(_field(b"\x12", scope.version.encode()))
    parts.append(_attributes(b"\x1a", scope.attributes))
    return b"".join(parts)


def _request(groups: Mapping[Resource, Mapping[InstrumentationScope | None, list[bytes]]]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of encoded spans grouped by resource,
    then by instrumentation scope."""
    resource_spans = []
    for resource, scopes in groups.items():
        parts = [_field(b"\x0a", _resource(resource))]
        for scope, encoded in scopes.items():
            scope_parts = [_field(b"\x0a", _scope(scope)), *encoded]
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
    groups: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    last_resource: Any = None
    last_scope: Any = None
    current: list[bytes] | None = None
    try:
        for span in spans:
            resource, scope = span.resource, span.instrumentation_scope or None
            if current is None or resource is not last_resource or scope is not last_scope:
                current = groups.setdefault(resource, {}).setdefault(scope, [])
                last_resource, last_scope = resource, scope
            current.append(_span(span))
        return _request(groups)
    except _ENCODE_ERRORS:
        return None


class OTLPSpanExporter(_OfficialExporter):
    """The official OTLP/HTTP span exporter, encoding with :func:`encode_spans`.

    Same constructor, settings and behaviour. A batch the fast encoder does not handle,
    one over the size limit, and every batch on an exporter version outside
    :data:`TESTED_VERSIONS` or without the internals this relies on go through the
    official ``export`` unchanged.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The official export's steps, reused: its HTTP client (retries, compression,
        # headers), its own metrics, its size limit.
        client = getattr(self, "_client", None)
        metrics = getattr(self, "_metrics", None)
        self._fast = (
            tested_version()
            and callable(getattr(client, "export", None))
            and callable(getattr(metrics, "export_operation", None))
            and isinstance(getattr(self, "_max_request_size", None), int)
            and isinstance(getattr(self, "_shutdown", None), bool)
        )

    @property
    def fast(self) -> bool:
        """True when batches are encoded by :func:`encode_spans` (a tested exporter
        version with the internals this relies on), False when every batch goes through
        the official ``export``."""
        return bool(self._fast)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export ``spans`` (see the class docstring)."""
        if not self._fast or self._shutdown:
            return super().export(spans)
        body = encode_spans(spans)
        limit = self._max_request_size
        if body is None or 0 < limit < len(body):
            return super().export(spans)  # it logs, counts and refuses as it does
        with self._metrics.export_operation(len(spans)) as result:
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
