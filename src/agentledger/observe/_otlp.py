"""An opt-in OTLP/HTTP span exporter with a faster encoder of the same bytes
(``AGENTLEDGER_OTLP_ENCODER=fast``).

The stock pipeline (:func:`agentledger.observe._tracing.otlp_provider`) exports through
the official ``OTLPSpanExporter``, whose encoder builds one protobuf object per span,
per attribute and per attribute value on the batch processor's thread, holding the GIL
while a busy worker's event loop waits for it. :func:`encode_spans` writes the same
``ExportTraceServiceRequest`` directly in protobuf's wire format, reading each span
through ``ReadableSpan``'s public properties: the same bytes as the official
``encode_spans(spans).SerializeToString()`` (the tests compare both, byte for byte and
decoded, over every attribute type, events, links, status, parents, trace state,
resources and scopes). A batch with something it does not handle exactly -- an
attribute value of a type the official encoder would convert or drop, an integer
outside int64, a string that is not valid UTF-8 -- goes through the official encoder.

:class:`OTLPSpanExporter` is a ``SpanExporter`` of its own: it encodes with
:func:`encode_spans` and posts the request itself (``requests``, which the official
exporter depends on too), from the same ``OTEL_EXPORTER_OTLP_*`` settings the official
exporter reads (endpoint, headers, timeout, compression, certificates) and retrying as
it does (429, 502, 503, 504 and lost connections, doubling from one second, honouring
``Retry-After``, within the timeout). Nothing private of the SDK is read.
:func:`span_exporter` chooses: this exporter only when asked for, on the SDK, proto and
encoder versions its bytes are tested against (:data:`TESTED_VERSIONS`) and with no
setting only the official exporter honours (a credential provider, the SDK's own
exporter metrics); otherwise it warns once and returns the official exporter.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as official_encode_spans,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as _PB2Span
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags as _PB2SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, StatusCode
from opentelemetry.util.re import parse_env_headers

from agentledger import _backoff

__all__ = [
    "TESTED_VERSIONS",
    "OTLPSpanExporter",
    "encode_spans",
    "span_exporter",
    "untested_versions",
]

_log = logging.getLogger(__name__)

#: The distributions whose versions decide the bytes (the SDK's span model, the proto
#: classes, the official encoder the tests compare with) and the range, from included
#: to excluded, that the byte-for-byte tests passed on.
TESTED_VERSIONS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "opentelemetry-sdk": ((1, 45), (1, 46)),
    "opentelemetry-proto": ((1, 45), (1, 46)),
    "opentelemetry-exporter-otlp-proto-common": ((1, 45), (1, 46)),
}


def untested_versions() -> list[str]:
    """The installed distributions outside :data:`TESTED_VERSIONS` (``name version``;
    ``missing`` or the unparsed version when it cannot be read): empty when the fast
    encoder may be used."""
    outside = []
    for name, (low, high) in TESTED_VERSIONS.items():
        try:
            installed = metadata.version(name)
            major, minor = (int(part) for part in installed.split(".")[:2])
        except metadata.PackageNotFoundError:
            outside.append(f"{name} missing")
            continue
        except ValueError:
            outside.append(f"{name} {installed}")
            continue
        if not low <= (major, minor) < high:
            outside.append(f"{name} {installed}")
    return outside


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


# What the exporter reads, as the official exporter reads it: the traces variable, else
# the general one (OTEL_EXPORTER_OTLP_TRACES_HEADERS, else OTEL_EXPORTER_OTLP_HEADERS).
_PREFIX, _TRACES_PREFIX = "OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_"
_DEFAULT_BASE = "http://localhost:4318"
_DEFAULT_TIMEOUT = 10.0
_DEFAULT_MAX_REQUEST_SIZE = 64 * 1024 * 1024  # the official exporter's
_MAX_TRIES = 6
_RETRYABLE = frozenset({429, 502, 503, 504})
# Settings only the official exporter honours: with one of them set, it exports.
_OFFICIAL_ONLY = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
)
_INTERNAL_METRICS = "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"


def _setting(name: str) -> str | None:
    return os.environ.get(_TRACES_PREFIX + name) or os.environ.get(_PREFIX + name) or None


def _endpoint() -> str:
    traces = os.environ.get(_TRACES_PREFIX + "ENDPOINT")
    if traces:
        return traces  # used as given, path included
    base = os.environ.get(_PREFIX + "ENDPOINT") or _DEFAULT_BASE
    return f"{base.removesuffix('/')}/v1/traces"


def _timeout() -> float:
    raw = _setting("TIMEOUT")
    try:
        return float(raw) if raw else _DEFAULT_TIMEOUT
    except ValueError:
        _log.warning("Invalid timeout value %r, using default of %s seconds", raw, _DEFAULT_TIMEOUT)
        return _DEFAULT_TIMEOUT


def _compression() -> str:
    value = (_setting("COMPRESSION") or "none").strip().lower()
    if value not in ("none", "gzip", "deflate"):
        _log.warning("Unsupported compression type: %s", value)
        return "none"
    return value


class OTLPSpanExporter(SpanExporter):
    """Spans to an OTLP/HTTP collector, encoded by :func:`encode_spans` (see the module's
    docstring). Arguments left out are read from the ``OTEL_EXPORTER_OTLP_*`` settings
    as the official exporter reads them."""

    def __init__(
        self,
        endpoint: str | None = None,
        certificate_file: str | None = None,
        client_key_file: str | None = None,
        client_certificate_file: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        compression: str | None = None,
        *,
        max_request_size: int | None = None,
    ) -> None:
        import requests

        self._endpoint = endpoint or _endpoint()
        self._timeout = _timeout() if timeout is None else float(timeout)
        self._compression = (compression or _compression()).lower()
        self._max_request_size = (
            _DEFAULT_MAX_REQUEST_SIZE if max_request_size is None else max_request_size
        )
        sent = {"content-type": "application/x-protobuf", "user-agent": "agentledger-otlp"}
        sent.update(parse_env_headers(_setting("HEADERS") or "", liberal=True))
        if headers:
            sent.update({key.lower(): value for key, value in headers.items()})
        if self._compression != "none":
            sent.setdefault("content-encoding", self._compression)
        self._headers = sent
        self._session = requests.Session()
        self._session.verify = certificate_file or _setting("CERTIFICATE") or True
        client_key = client_key_file or _setting("CLIENT_KEY")
        client_cert = client_certificate_file or _setting("CLIENT_CERTIFICATE")
        if client_cert:
            self._session.cert = (client_cert, client_key) if client_key else client_cert
        self._connection_error: type[Exception] = requests.ConnectionError
        self._request_error: type[Exception] = requests.RequestException
        self._stopping = threading.Event()
        self._shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Encode ``spans`` and post them (retrying as the official exporter does)."""
        if self._shut:
            _log.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE
        body = encode_spans(spans)
        if body is None:  # something only the official encoder handles
            try:
                body = official_encode_spans(spans).SerializePartialToString()
            except Exception as error:
                _log.error("Failed to encode span batch: %s", error)
                return SpanExportResult.FAILURE
        if 0 < self._max_request_size < len(body):
            _log.warning(
                "Dropping span batch: serialized size %d bytes exceeds max_request_size %d bytes.",
                len(body),
                self._max_request_size,
            )
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self._post(body) else SpanExportResult.FAILURE

    def _compress(self, body: bytes) -> bytes:
        if self._compression == "gzip":
            return gzip.compress(body, mtime=0)
        if self._compression == "deflate":
            return zlib.compress(body)
        return body

    def _post(self, body: bytes) -> bool:
        data = self._compress(body)
        deadline = time.monotonic() + self._timeout
        pauses = _backoff.Backoff(first=1.0, cap=32.0)
        reconnected = False
        for tries in range(1, _MAX_TRIES + 1):
            status: int | None = None
            asked: float | None = None
            try:
                reply = self._session.post(
                    self._endpoint,
                    data=data,
                    headers=self._headers,
                    timeout=max(deadline - time.monotonic(), 0.001),
                )
            except self._connection_error as error:
                if not reconnected:  # a stale pooled connection: once more at once
                    reconnected = True
                    continue
                failure: Any = error
                retryable = True
            except self._request_error as error:
                failure, retryable = error, False
            else:
                status = reply.status_code
                if 200 <= status < 400:
                    return True
                failure, retryable = reply.reason, status in _RETRYABLE
                if retryable:
                    asked = _backoff.retry_after_seconds(reply.headers.get("retry-after"))
            if not retryable:
                _log.error("Failed to export spans batch code: %s, reason: %s", status, failure)
                return False
            pause = pauses.next() if asked is None else asked
            if tries == _MAX_TRIES or pause > deadline - time.monotonic():
                _log.error("Failed to export spans batch due to timeout or max retries.")
                return False
            _log.warning("Transient error %s exporting spans, retrying in %.2fs.", failure, pause)
            if self._stopping.wait(pause):
                _log.warning("Shutdown in progress, aborting retry.")
                return False
        return False

    def shutdown(self) -> None:
        """No more exports; a retry waiting gives up."""
        if self._shut:
            _log.warning("Exporter already shutdown, ignoring call")
            return
        self._shut = True
        self._stopping.set()
        self._session.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here."""
        return True


_warned = threading.Lock()
_WARNED: list[str] = []


def _why_official() -> str | None:
    """Why the official exporter must be used although the fast one was asked for."""
    outside = untested_versions()
    if outside:
        return f"untested versions ({', '.join(outside)})"
    for name in _OFFICIAL_ONLY:
        if os.environ.get(name):
            return f"{name} is set"
    if os.environ.get(_INTERNAL_METRICS, "").strip().lower() == "true":
        return f"{_INTERNAL_METRICS} is set"
    return None


def span_exporter(endpoint: str | None = None, fast: bool = False) -> SpanExporter:
    """The exporter of :func:`agentledger.observe._tracing.otlp_provider`: the official
    ``OTLPSpanExporter``, or with ``fast`` this module's when :func:`_why_official`
    finds nothing against it (else the official one, with a warning logged once per
    process)."""
    if fast:
        reason = _why_official()
        if reason is None:
            return OTLPSpanExporter(endpoint=endpoint)
        with _warned:
            first = not _WARNED
            _WARNED.append(reason)
        if first:
            _log.warning(
                "AGENTLEDGER_OTLP_ENCODER=fast: exporting with the official OTLP encoder "
                "instead (%s; the fast encoder is tested with %s)",
                reason,
                ", ".join(f"{n} {lo[0]}.{lo[1]}" for n, (lo, _hi) in TESTED_VERSIONS.items()),
            )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as Official,
    )

    return Official(endpoint=endpoint) if endpoint else Official()
