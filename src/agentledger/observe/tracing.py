"""OpenTelemetry spans of runs, model attempts and tool attempts (GenAI conventions;
every name is in :mod:`agentledger.observe.semconv`).

Nothing is exported unless a tracer provider is configured (the OpenTelemetry SDK, e.g.
:func:`configure_otlp`); without one every hook is a no-op costing a type check. The
process histograms (:mod:`agentledger.observe.instruments`) are recorded either way.

A run's trace context is stored with the run by its first execution (a guarded UPDATE:
the first one wins), and every later execution -- a resume on another worker -- starts
its ``invoke_agent``/``invoke_workflow`` span as a child of it: one trace per run. A step
replayed from the journal gets a span marked ``agentledger.step.replayed`` with no usage
attributes, so its tokens are never counted twice. Message content is attached only
when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentledger.observe import semconv as sc
from agentledger.observe.instruments import OPERATION_DURATION, STEP_DURATION, TOKEN_USAGE

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER_NAME = "agentledger"
# The model step being attempted: set by the agent loop, read by model_attempt (the
# gateway's call protocol does not pass it down).
_MODEL_STEP: ContextVar[int | None] = ContextVar("agentledger_model_step", default=None)


# A provider used instead of the global one (set_provider): lets a process switch
# tracing on and off (the global provider can be set only once).
_PROVIDER: trace.TracerProvider | None = None


def set_provider(provider: trace.TracerProvider | None) -> None:
    """Trace agentledger's spans with ``provider`` instead of the global provider
    (``None``: back to the global one; a ``NoOpTracerProvider`` switches tracing off)."""
    global _PROVIDER
    _PROVIDER = provider


def enabled() -> bool:
    """True when a real tracer provider is configured (spans are recorded)."""
    provider = _PROVIDER if _PROVIDER is not None else trace.get_tracer_provider()
    return type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")


def capture_content() -> bool:
    return os.environ.get(sc.ENV_CAPTURE_CONTENT, "").lower() in ("1", "true", "yes")


_CACHED: tuple[Any, trace.Tracer] | None = None


def _tracer() -> trace.Tracer:
    global _CACHED
    provider = _PROVIDER if _PROVIDER is not None else trace.get_tracer_provider()
    if _CACHED is None or _CACHED[0] is not provider:  # one tracer per provider, not per span
        _CACHED = (provider, provider.get_tracer(_TRACER_NAME))
    return _CACHED[1]


def configure_otlp(endpoint: str | None = None) -> None:
    """Export spans with OTLP over HTTP (the ``agentledger[otel]`` extra)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


@contextlib.asynccontextmanager
async def run_span(store: Any, run: Any, kind: str) -> AsyncIterator[None]:
    """The span of one execution of ``run``, joined to the run's stored trace."""
    if not enabled():
        yield
        return
    parent = None
    stored = await _stored_context(store, run.id)
    if stored:
        parent = _PROPAGATOR.extract({"traceparent": stored})
    op = sc.OP_INVOKE_AGENT if kind == "agent" else sc.OP_INVOKE_WORKFLOW
    span = _tracer().start_span(
        f"{op} {run.name}",
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes={
            sc.GEN_AI_OPERATION_NAME: op,
            sc.GEN_AI_AGENT_NAME: run.name,
            sc.GEN_AI_CONVERSATION_ID: run.id,
            sc.RUN_ID: run.id,
            sc.RUN_VERSION: run.version,
            sc.RUN_TENANT: run.tenant_id,
            sc.RUN_EXECUTION: run.lease_epoch,
        },
    )
    if not stored:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        with contextlib.suppress(NotImplementedError):
            await store.claim_trace_context(run.id, carrier["traceparent"])
    with trace.use_span(span, end_on_exit=True, record_exception=True):
        yield


async def _stored_context(store: Any, run_id: str) -> str | None:
    try:
        found: str | None = await store.trace_context(run_id)
        return found
    except (NotImplementedError, AttributeError):
        return None


def set_outcome(outcome: str) -> None:
    """Record where the current run execution ended."""
    span = trace.get_current_span()
    if not isinstance(span, NonRecordingSpan):
        span.set_attribute(sc.RUN_OUTCOME, outcome)


@dataclass
class Attempt:
    """What a hook learns while an attempt runs (set by the caller)."""

    response: Any = None
    resolution: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _effect(tool: Any) -> str:
    if getattr(tool, "delivery", None) == "outbox":
        return "outbox"
    return "write" if getattr(tool, "writes", False) else "read"


# The step-duration histogram's children by (tool, effect, outcome): a labels() lookup
# builds and checks the label values on every call, a dict lookup is all a step needs.
# (The registry keeps every child it made anyway; this holds the same ones.)
_STEP_CHILDREN: dict[tuple[str, str, str], Any] = {}


def _step_duration(tool: str, effect: str, outcome: str) -> Any:
    key = (tool, effect, outcome)
    child = _STEP_CHILDREN.get(key)
    if child is None:
        child = _STEP_CHILDREN[key] = STEP_DURATION.labels(tool, effect, outcome)
    return child


@contextlib.contextmanager
def tool_attempt(exe: Any, step: Any, tool: Any, key: str, attempt: int) -> Iterator[Attempt]:
    """One tool attempt: the ``execute_tool {tool}`` span and the duration histogram."""
    rec = Attempt()
    effect = _effect(tool)
    started = time.perf_counter()
    span = None
    if enabled():
        span = _tracer().start_span(
            f"{sc.OP_EXECUTE_TOOL} {tool.name}",
            attributes={
                sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
                sc.GEN_AI_TOOL_NAME: tool.name,
                sc.GEN_AI_TOOL_CALL_ID: key,
                sc.GEN_AI_TOOL_TYPE: "function",
                sc.RUN_ID: exe.run.id,
                sc.STEP_NO: step.step_no,
                sc.TOOL_EFFECT: effect,
                sc.IDEMPOTENCY_KEY: key,
                sc.STEP_ATTEMPT: attempt,
                sc.STEP_REPLAYED: False,
            },
        )
    outcome = "ok"
    try:
        yield rec
    except BaseException as exc:
        outcome = str(getattr(exc, "error_class", None) or type(exc).__name__)
        if span is not None:
            span.set_attribute(sc.ERROR_TYPE, outcome)
            span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        raise
    finally:
        _step_duration(tool.name, effect, outcome).observe(time.perf_counter() - started)
        if span is not None:
            span.set_attribute(sc.STEP_OUTCOME, outcome)
            if rec.resolution:
                span.set_attribute(sc.UNKNOWN_RESOLUTION, rec.resolution)
            span.end()


def replayed_step(exe: Any, step: Any) -> None:
    """A step answered from the journal: a span marked replayed, with no usage.

    A model step keeps its GenAI attributes (provider, models, finish reason) from the
    journal but never its token counts, so usage summed over spans counts each call once.
    """
    if not enabled():
        return
    kind = getattr(step, "kind", "tool")
    attributes: dict[str, Any] = {
        sc.RUN_ID: exe.run.id,
        sc.STEP_NO: step.step_no,
        sc.STEP_KIND: kind,
        sc.STEP_REPLAYED: True,
        sc.STEP_OUTCOME: step.status,
    }
    if kind == "model":
        name = _replayed_model(step, attributes)
    elif kind == "step":
        name = f"{sc.SPAN_STEP} {step.name}"
    else:
        name = f"{sc.OP_EXECUTE_TOOL} {step.name}"
        attributes[sc.GEN_AI_OPERATION_NAME] = sc.OP_EXECUTE_TOOL
        attributes[sc.GEN_AI_TOOL_NAME] = step.name
        if step.idempotency_key:
            attributes[sc.GEN_AI_TOOL_CALL_ID] = step.idempotency_key
            attributes[sc.IDEMPOTENCY_KEY] = step.idempotency_key
    _tracer().start_span(name, attributes=attributes).end()


def _replayed_model(step: Any, attributes: dict[str, Any]) -> str:
    """The GenAI attributes of a journaled model step (its answering attempt)."""
    out = step.output if isinstance(step.output, dict) else {}
    attempts = [a for a in out.get("attempts", []) if isinstance(a, dict) and "skipped" not in a]
    answering = attempts[-1] if attempts else {}
    requested = str(answering.get("model") or step.name)
    attributes[sc.GEN_AI_OPERATION_NAME] = sc.OP_CHAT
    attributes[sc.GEN_AI_PROVIDER_NAME] = str(
        out.get("provider") or answering.get("provider") or step.name
    )
    attributes[sc.GEN_AI_REQUEST_MODEL] = requested
    if out.get("model"):
        attributes[sc.GEN_AI_RESPONSE_MODEL] = str(out["model"])
    if out.get("finish_reason"):
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [str(out["finish_reason"])]
    return f"{sc.OP_CHAT} {requested}"


@contextlib.contextmanager
def model_step_scope(step_no: int) -> Iterator[None]:
    """Attempts made inside are attempts of model step ``step_no`` (for their spans)."""
    token = _MODEL_STEP.set(step_no)
    try:
        yield
    finally:
        _MODEL_STEP.reset(token)


@contextlib.contextmanager
def workflow_step(exe: Any, step_no: int, name: str) -> Iterator[Attempt]:
    """The first pass of a workflow's ``ctx.step``: a ``step {name}`` span."""
    rec = Attempt()
    if not enabled():
        yield rec
        return
    span = _tracer().start_span(
        f"{sc.SPAN_STEP} {name}",
        attributes={
            sc.RUN_ID: exe.run.id,
            sc.STEP_NO: step_no,
            sc.STEP_KIND: "step",
            sc.STEP_REPLAYED: False,
        },
    )
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False):
            yield rec
    finally:
        outcome = rec.resolution or "interrupted"  # the caller sets succeeded / failed
        span.set_attribute(sc.STEP_OUTCOME, outcome)
        if outcome != "succeeded":
            span.set_attribute(sc.ERROR_TYPE, str(rec.extra.get("error_class") or outcome))
            span.set_status(Status(StatusCode.ERROR))
        span.end()


@contextlib.contextmanager
def model_attempt(exe: Any, model: Any) -> Iterator[Attempt]:
    """One model attempt: the ``chat {model}`` span and the ``gen_ai.client.*`` metrics."""
    rec = Attempt()
    provider = str(getattr(model, "provider", "") or model.name)
    requested = str(getattr(model, "model", "") or model.name)
    started = time.perf_counter()
    span = None
    if enabled():
        span = _tracer().start_span(
            f"{sc.OP_CHAT} {requested}",
            kind=SpanKind.CLIENT,
            attributes={
                sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
                sc.GEN_AI_PROVIDER_NAME: provider,
                sc.GEN_AI_REQUEST_MODEL: requested,
                sc.RUN_ID: exe.run.id,
                sc.STEP_KIND: "model",
                sc.STEP_REPLAYED: False,
            },
        )
        step_no = _MODEL_STEP.get()
        if step_no is not None:
            span.set_attribute(sc.STEP_NO, step_no)
    error: str | None = None
    try:
        yield rec
    except BaseException as exc:
        error = str(getattr(exc, "error_class", None) or type(exc).__name__)
        if span is not None:
            span.set_attribute(sc.ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        raise
    finally:
        labels = (sc.OP_CHAT, provider, requested)
        OPERATION_DURATION.labels(*labels, error or "").observe(time.perf_counter() - started)
        response = rec.response
        if response is not None:
            usage = response.usage
            TOKEN_USAGE.labels(*labels, sc.TOKEN_TYPE_INPUT).observe(usage.input_tokens)
            TOKEN_USAGE.labels(*labels, sc.TOKEN_TYPE_OUTPUT).observe(usage.output_tokens)
            if span is not None:
                span.set_attribute(sc.GEN_AI_RESPONSE_MODEL, response.model or requested)
                span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, usage.input_tokens)
                span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, usage.output_tokens)
                span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, [response.finish_reason])
                if capture_content():
                    span.set_attribute(sc.GEN_AI_OUTPUT_MESSAGES, str(response.message)[:10000])
        if span is not None:
            span.end()
