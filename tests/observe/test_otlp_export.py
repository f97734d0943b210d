"""Spans leave through a batch processor (never on the worker's loop, span by span) and
reach an OTLP/HTTP collector on loopback; switching the provider switches tracing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

from agentledger.observe import _semconv as sc
from agentledger.observe import _tracing as tracing
from agentledger.records import RunStatus
from agentledger_bench._watchers import CollectorStub
from tests.fast.lifecycle_harness import KILLED, Harness
from tests.observe.apps import Payments, booking_app


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[CollectorStub]:
    # The processor's timer would export on its own after this delay: far away, so what
    # reaches the collector is decided by the batch alone (and by force_flush).
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    stub = CollectorStub(keep_bodies=True)
    yield stub
    tracing.set_provider(None)
    stub.close()


@pytest.mark.parametrize("fast_encoder", [False, True])
async def test_spans_are_batched_then_exported_over_otlp_http(
    tmp_path: Path, collector: CollectorStub, fast_encoder: bool
) -> None:
    provider = tracing.otlp_provider(collector.url, fast_encoder=fast_encoder)
    tracing.set_provider(provider)
    try:
        async with Harness(tmp_path, booking_app(Payments())) as h:
            run_id = await h.submit("booking")
            assert await h.execute(run_id, owner="w1") == RunStatus.COMPLETED
        # Every span has ended, none was sent: they wait in the batch (a simple processor
        # would have posted each one as it ended, on the run's event loop).
        assert collector.bodies == []
        assert provider.force_flush()
    finally:
        provider.shutdown()
    sent = b"".join(collector.bodies)
    assert collector.bodies and b"execute_tool search" in sent and b"execute_tool pay" in sent
    assert run_id.encode() in sent and sc.GEN_AI_TOOL_CALL_ID.encode() in sent


async def test_switching_the_provider_switches_the_spans(tmp_path: Path) -> None:
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    providers = []
    for exporter in (first, second):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        providers.append(provider)
    try:
        async with Harness(tmp_path, booking_app(Payments())) as h:
            for provider in (providers[0], trace.NoOpTracerProvider(), providers[1]):
                tracing.set_provider(provider)
                assert tracing.enabled() == isinstance(provider, TracerProvider)
                run_id = await h.submit("booking")
                assert await h.execute(run_id, owner="w1") == RunStatus.COMPLETED
                provider_runs = {
                    s.attributes.get(sc.RUN_ID)
                    for s in (first.get_finished_spans() + second.get_finished_spans())
                }
                assert (run_id in provider_runs) == isinstance(provider, TracerProvider)
    finally:
        tracing.set_provider(None)
    names = [s.name for s in second.get_finished_spans()]
    assert "execute_tool search" in names and "invoke_workflow booking" in names
    assert {s.attributes.get(sc.RUN_ID) for s in first.get_finished_spans()}.isdisjoint(
        {s.attributes.get(sc.RUN_ID) for s in second.get_finished_spans()}
    )


async def test_a_run_left_out_by_the_sampler_stays_out_after_a_resume(tmp_path: Path) -> None:
    """The run's stored trace context carries the sampling decision of its first
    execution: a resumed run is the same trace, sampled in or out as a whole."""
    exporter = InMemorySpanExporter()
    left_out, taken = (
        TracerProvider(sampler=ParentBased(root)) for root in (ALWAYS_OFF, ALWAYS_ON)
    )
    for provider in (left_out, taken):
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        async with Harness(tmp_path, booking_app(Payments(kill_after_apply=True))) as h:
            run_id = await h.submit("booking")
            tracing.set_provider(left_out)
            assert await h.execute(run_id, owner="w1") == KILLED
            # A worker whose sampler would take every new trace resumes the run.
            tracing.set_provider(taken)
            assert await h.execute(run_id, owner="w2") == RunStatus.COMPLETED
            other = await h.submit("booking")
            assert await h.execute(other, owner="w2") == RunStatus.COMPLETED
    finally:
        tracing.set_provider(None)
    runs = {s.attributes.get(sc.RUN_ID) for s in exporter.get_finished_spans()}
    assert other in runs  # the second worker does record new runs
    assert run_id not in runs  # but not the steps of a run its first execution left out
