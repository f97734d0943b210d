"""The opt-in fast exporter (``AGENTLEDGER_OTLP_ENCODER=fast``): chosen only when asked
for and on the SDK versions its bytes are tested with (else the official exporter, with
one warning); it reads the ``OTEL_EXPORTER_OTLP_*`` settings and retries as the official
exporter does, and posts what the official exporter posts."""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as official
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as OfficialExporter,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from agentledger.errors import UsageError
from agentledger.observe import _otlp as otlp
from agentledger.observe import _tracing as tracing
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import Harness
from tests.observe.apps import Payments, booking_app


class Collector:
    """An OTLP/HTTP endpoint on loopback that keeps every request (path, headers, body)
    and answers each with the next of ``answers`` (status, headers), then 200."""

    def __init__(self, answers: list[tuple[int, dict[str, str]]] | None = None) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.answers = list(answers or [])
        self.arrived = threading.Event()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                collector.requests.append((self.path, headers, body))
                status, extra = collector.answers.pop(0) if collector.answers else (200, {})
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()
                collector.arrived.set()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    stub = Collector()
    yield stub
    stub.close()


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("ENDPOINT", "HEADERS", "COMPRESSION", "TIMEOUT"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{name}", raising=False)
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_TRACES_{name}", raising=False)
    monkeypatch.delenv("AGENTLEDGER_OTLP_ENCODER", raising=False)
    monkeypatch.setattr(otlp, "_WARNED", [])
    yield
    tracing.set_provider(None)


SPAN = ReadableSpan("x", SpanContext(1, 2, is_remote=False), attributes={"a": 1, "b": "c"})


def test_the_choice_is_the_official_exporter_unless_fast_is_asked_for() -> None:
    assert type(otlp.span_exporter("http://127.0.0.1:9/v1/traces")) is OfficialExporter
    fast = otlp.span_exporter("http://127.0.0.1:9/v1/traces", fast=True)
    assert type(fast) is otlp.OTLPSpanExporter
    fast.shutdown()


@pytest.mark.parametrize(
    "setting",
    [
        {"range": {"opentelemetry-sdk": ((0, 1), (0, 2))}},
        {"range": {"opentelemetry-proto": ((9, 0), (9, 1))}},
        {"range": {"no-such-distribution": ((1, 0), (9, 0))}},
        {"env": ("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")},
    ],
)
def test_outside_what_it_is_tested_with_the_official_exporter_is_used_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, setting: dict[str, Any]
) -> None:
    if "range" in setting:
        monkeypatch.setattr(otlp, "TESTED_VERSIONS", {**otlp.TESTED_VERSIONS, **setting["range"]})
    else:
        monkeypatch.setenv(*setting["env"])
    with caplog.at_level(logging.WARNING, logger=otlp.__name__):
        first = otlp.span_exporter("http://127.0.0.1:9/v1/traces", fast=True)
        second = otlp.span_exporter("http://127.0.0.1:9/v1/traces", fast=True)
    assert type(first) is OfficialExporter and type(second) is OfficialExporter
    warnings = [r for r in caplog.records if "official OTLP encoder" in r.getMessage()]
    assert len(warnings) == 1


def test_a_credential_provider_is_left_to_the_official_exporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the official exporter loads a credential provider's session (it refuses a name
    # it cannot find: it was asked).
    monkeypatch.setenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER", "mine")
    with pytest.raises(RuntimeError, match="opentelemetry_otlp_credential_provider"):
        otlp.span_exporter("http://127.0.0.1:9/v1/traces", fast=True)


def _post_both(collector: Collector, spans: list[ReadableSpan]) -> tuple[Any, Any]:
    ours, theirs = otlp.OTLPSpanExporter(), OfficialExporter()
    try:
        assert ours.export(spans).name == "SUCCESS"
        assert theirs.export(spans).name == "SUCCESS"
    finally:
        ours.shutdown()
        theirs.shutdown()
    assert len(collector.requests) == 2
    return collector.requests[0], collector.requests[1]


def test_it_reads_the_otlp_settings_as_the_official_exporter(
    monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.base + "/base/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=core,x-key=ignored")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-key=k%201")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    (path, headers, body), (their_path, their_headers, their_body) = _post_both(collector, [SPAN])
    assert path == their_path == "/base/v1/traces"
    for name in ("x-key", "content-encoding", "content-type"):
        assert headers[name] == their_headers[name], name
    assert headers["x-key"] == "k 1" and "x-team" not in headers  # the traces variable wins
    assert gzip.decompress(body) == gzip.decompress(their_body)
    assert gzip.decompress(body) == official([SPAN]).SerializeToString()


def test_the_traces_endpoint_is_used_as_given(
    monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.base + "/custom")
    (path, _, body), (their_path, _, their_body) = _post_both(collector, [SPAN])
    assert path == their_path == "/custom" and body == their_body


def test_a_busy_collector_is_tried_again_after_its_retry_after() -> None:
    collector = Collector([(503, {"Retry-After": "0"}), (429, {"Retry-After": "0"})])
    try:
        exporter = otlp.OTLPSpanExporter(endpoint=collector.base + "/v1/traces", timeout=30)
        assert exporter.export([SPAN]).name == "SUCCESS"
        exporter.shutdown()
    finally:
        collector.close()
    bodies = [body for _, _, body in collector.requests]
    assert bodies == [official([SPAN]).SerializeToString()] * 3


def test_a_refusal_is_not_tried_again() -> None:
    collector = Collector([(400, {})])
    try:
        exporter = otlp.OTLPSpanExporter(endpoint=collector.base + "/v1/traces", timeout=30)
        assert exporter.export([SPAN]).name == "FAILURE"
        exporter.shutdown()
    finally:
        collector.close()
    assert len(collector.requests) == 1


def test_shutdown_ends_a_wait_before_trying_again() -> None:
    collector = Collector([(503, {"Retry-After": "120"})])
    exporter = otlp.OTLPSpanExporter(endpoint=collector.base + "/v1/traces", timeout=600)
    results: list[str] = []
    sender = threading.Thread(target=lambda: results.append(exporter.export([SPAN]).name))
    try:
        sender.start()
        assert collector.arrived.wait(30)
        exporter.shutdown()
        sender.join(60)
    finally:
        collector.close()
    assert results == ["FAILURE"] and len(collector.requests) == 1


async def test_the_setting_switches_a_provider_to_the_fast_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    agents = {}
    for setting in ("official", "fast"):
        monkeypatch.setenv("AGENTLEDGER_OTLP_ENCODER", setting)
        provider = tracing.otlp_provider(collector.base + "/v1/traces")
        tracing.set_provider(provider)
        try:
            async with Harness(tmp_path / setting, booking_app(Payments())) as h:
                run_id = await h.submit("booking")
                assert await h.execute(run_id, owner="w1") == RunStatus.COMPLETED
            assert provider.force_flush()
        finally:
            provider.shutdown()
            tracing.set_provider(None)
        agents[setting] = {headers["user-agent"] for _, headers, _ in collector.requests}
        sent = b"".join(body for _, _, body in collector.requests)
        assert b"execute_tool pay" in sent and run_id.encode() in sent
        collector.requests.clear()
    assert agents["fast"] == {"agentledger-otlp"}
    assert agents["official"] != agents["fast"]


def test_an_unknown_encoder_setting_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTLEDGER_OTLP_ENCODER", "quick")
    with pytest.raises(UsageError, match="AGENTLEDGER_OTLP_ENCODER must be official or fast"):
        tracing.otlp_provider("http://127.0.0.1:9/v1/traces")
