"""OpenTelemetry spans of runs, model attempts and tool attempts (GenAI conventions;
every name is in :mod:`agentledger.observe._semconv`).

Nothing is exported unless a tracer provider is configured (the OpenTelemetry SDK, e.g.
:func:`configure_otlp`); without one every hook is a no-op costing a type check. The
process histograms (:mod:`agentledger.observe._instruments`) are recorded either way.

Every span is made through the configured provider's public ``Tracer.start_span``: its
sampler, span limits, processors and exporter decide what is recorded and sent. Spans
never made current (tool attempts, replayed steps) are made after their work, together
(:mod:`agentledger.observe._spanbatch`); run and ``ctx.step`` spans are made inline. This
module needs only the OpenTelemetry API; the SDK and the OTLP exporter are imported by
:func:`otlp_provider` when a process asks for them.

The engine calls these through its hook points (:mod:`agentledger.engine._hooks`), which
:func:`install` points here when :mod:`agentledger.observe` is imported.

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
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentledger._extras import require
from agentledger.engine import _hooks as hooks
from agentledger.engine._hooks import Attempt
from agentledger.observe import _instruments as instruments
from agentledger.observe import _semconv as sc
from agentledger.observe._queries import trace as observe_trace
from agentledger.observe._spanbatch import SpanBatch

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER_NAME = "agentledger"
# The model step being attempted: set by the agent loop, read by model_attempt (the
# gateway's call protocol does not pass it down).
_MODEL_STEP: ContextVar[int | None] = ContextVar("agentledger_model_step", default=None)


# Tool attempt and replayed step spans, kept until made together (_spanbatch).
_BATCH = SpanBatch()

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
    return _recording_tracer() is not None


def capture_content() -> bool:
    return os.environ.get(sc.ENV_CAPTURE_CONTENT, "").lower() in ("1", "true", "yes")


# (provider, its tracer or None when the provider records nothing): made once per
# provider, not per span. The global provider is asked for on every hook because it can
# be set at any time (cheap once set; while unset the API also looks for
# OTEL_PYTHON_TRACER_PROVIDER).
_CACHED: tuple[Any, trace.Tracer | None] | None = None
# What the API returns while no SDK provider is configured: nothing is recorded.
_OFF = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def _recording_tracer() -> trace.Tracer | None:
    """agentledger's tracer from the active provider, or None when nothing is recorded."""
    global _CACHED
    provider = _PROVIDER if _PROVIDER is not None else trace.get_tracer_provider()
    cached = _CACHED
    if cached is None or cached[0] is not provider:
        tracer = None if isinstance(provider, _OFF) else provider.get_tracer(_TRACER_NAME)
        cached = _CACHED = (provider, tracer)
    return cached[1]


def otlp_provider(
    endpoint: str | None = None, fast_encoder: bool | None = None
) -> trace.TracerProvider:
    """A tracer provider exporting OTLP over HTTP (the ``agentledger[otel]`` extra): the
    SDK's ``TracerProvider`` (sampler, span limits and resource from the ``OTEL_*``
    environment) with its ``BatchSpanProcessor`` (``OTEL_BSP_*``) into the official
    ``OTLPSpanExporter`` (``OTEL_EXPORTER_OTLP_*``; ``endpoint`` overrides the traces
    endpoint). Spans are queued when they end and encoded and sent by the processor's
    thread, never on the worker's event loop.

    ``fast_encoder`` (default: ``AGENTLEDGER_OTLP_ENCODER=fast``): export with
    :class:`agentledger.observe._otlp.OTLPSpanExporter` instead, which sends the same
    bytes with less CPU, on the SDK versions it is tested with (elsewhere the official
    exporter, with a warning; :func:`agentledger.observe._otlp.span_exporter`)."""
    require("otel", "exporting spans with OTLP")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from agentledger import _envsettings as envsettings
    from agentledger.observe import _otlp

    if fast_encoder is None:
        fast_encoder = envsettings.current().otlp_encoder == "fast"
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_otlp.span_exporter(endpoint, fast_encoder)))
    return provider


def configure_otlp(endpoint: str | None = None, fast_encoder: bool | None = None) -> None:
    """Export spans with OTLP over HTTP (the ``agentledger[otel]`` extra; see
    :func:`otlp_provider`)."""
    trace.set_tracer_provider(otlp_provider(endpoint, fast_encoder))


@contextlib.asynccontextmanager
async def run_span(store: Any, run: Any, kind: str) -> AsyncIterator[None]:
    """The span of one execution of ``run``, joined to the run's stored trace."""
    tracer = _recording_tracer()
    if tracer is None:
        yield
        return
    parent = None
    stored = await _stored_context(store, run.id)
    if stored:
        parent = _PROPAGATOR.extract({"traceparent": stored})
    op = sc.OP_INVOKE_AGENT if kind == "agent" else sc.OP_INVOKE_WORKFLOW
    span = tracer.start_span(
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
            await store.transact(observe_trace.claim_trace_context, run.id, carrier["traceparent"])
    with trace.use_span(span, end_on_exit=True, record_exception=True):
        try:
            yield
        finally:
            _BATCH.flush()  # the execution's kept spans, before its own span ends


async def _stored_context(store: Any, run_id: str) -> str | None:
    try:
        found: str | None = await store.read(observe_trace.get_trace_context, run_id)
        return found
    except (NotImplementedError, AttributeError):
        return None


def set_outcome(outcome: str) -> None:
    """Record where the current run execution ended."""
    span = trace.get_current_span()
    if not isinstance(span, NonRecordingSpan):
        span.set_attribute(sc.RUN_OUTCOME, outcome)


def _effect(tool: Any) -> str:
    if getattr(tool, "delivery", None) == "outbox":
        return "outbox"
    return "write" if getattr(tool, "writes", False) else "read"


# Histogram children by instrument name and label values: ``labels()`` builds and checks
# the label values on every call, and naming an instrument on ``_instruments`` takes its
# lock; a dict lookup is all a step needs. (The registry keeps every child it made
# anyway; this holds the same ones, keyed by the same values.)
_CHILDREN: dict[tuple[str, tuple[str, ...]], Any] = {}


def _child(metric: str, *labels: str) -> Any:
    """The child of the instrument named ``metric`` (in :mod:`._instruments`) with
    ``labels``."""
    key = (metric, labels)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = getattr(instruments, metric).labels(*labels)
    return child


# Per (tool, effect class): the span name and the attributes every attempt carries, built
# once; an attempt adds its own four (tools are registered, so this stays small). The
# step's idempotency key is ``gen_ai.tool.call.id``, not also a second attribute: every
# attribute is validated, queued and encoded once per span.
_TOOL_SPANS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}


def _tool_span(name: str, effect: str) -> tuple[str, dict[str, Any]]:
    found = _TOOL_SPANS.get((name, effect))
    if found is None:
        found = _TOOL_SPANS[(name, effect)] = (
            f"{sc.OP_EXECUTE_TOOL} {name}",
            {
                sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
                sc.GEN_AI_TOOL_NAME: name,
                sc.GEN_AI_TOOL_TYPE: "function",
                sc.TOOL_EFFECT: effect,
                sc.STEP_REPLAYED: False,
            },
        )
    return found


class ToolAttempt:
    """One tool attempt: the ``execute_tool {tool}`` span and the duration histogram.

    A plain context manager (no generator). The span is never made current (nothing
    inside a tool attempt starts spans of ours), so it is kept when the attempt ends,
    with its start time, attributes and outcome, and made in a batch with others
    (:mod:`agentledger.observe._spanbatch`).
    """

    __slots__ = (
        "_attributes",
        "_effect",
        "_name",
        "_parent",
        "_start",
        "_started",
        "_tool",
        "_tracer",
        "rec",
    )

    def __init__(self, exe: Any, step: Any, tool: Any, key: str, attempt: int) -> None:
        self.rec = Attempt()
        self._tool, self._effect = tool.name, _effect(tool)
        self._tracer = tracer = _recording_tracer()
        if tracer is not None:
            self._name, constant = _tool_span(self._tool, self._effect)
            self._attributes = {
                **constant,
                sc.GEN_AI_TOOL_CALL_ID: key,
                sc.RUN_ID: exe.run.id,
                sc.STEP_NO: step.step_no,
                sc.STEP_ATTEMPT: attempt,
            }
            self._parent = otel_context.get_current()
            self._start = time.time_ns()
        self._started = time.perf_counter()

    def __enter__(self) -> Attempt:
        return self.rec

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        elapsed = time.perf_counter() - self._started
        outcome = "ok" if exc is None else str(getattr(exc, "error_class", None) or kind.__name__)
        _child("STEP_DURATION", self._tool, self._effect, outcome).observe(elapsed)
        tracer = self._tracer
        if tracer is None:
            return
        attributes = self._attributes
        attributes[sc.STEP_OUTCOME] = outcome
        status = None
        if exc is not None:
            attributes[sc.ERROR_TYPE] = outcome
            status = Status(StatusCode.ERROR, str(exc)[:200])
        if self.rec.resolution:
            attributes[sc.UNKNOWN_RESOLUTION] = self.rec.resolution
        _BATCH.add(
            tracer, self._name, self._parent, attributes, self._start, time.time_ns(), status
        )


def _end(span: trace.Span, ending: dict[str, Any], status: Status | None) -> None:
    """End ``span`` with ``ending`` attributes (one call for all of them) and ``status``."""
    if status is not None:
        span.set_status(status)
    if ending:
        span.set_attributes(ending)
    span.end()


def tool_attempt(exe: Any, step: Any, tool: Any, key: str, attempt: int) -> ToolAttempt:
    """One tool attempt (:class:`ToolAttempt`): ``with tool_attempt(...) as rec``."""
    return ToolAttempt(exe, step, tool, key, attempt)


def replayed_step(exe: Any, step: Any) -> None:
    """A step answered from the journal: a span marked replayed, with no usage.

    A model step keeps its GenAI attributes (provider, models, finish reason) from the
    journal but never its token counts, so usage summed over spans counts each call once.
    """
    tracer = _recording_tracer()
    if tracer is None:
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
    now = time.time_ns()
    _BATCH.add(tracer, name, otel_context.get_current(), attributes, now, now)


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


class WorkflowStep:
    """The first pass of a workflow's ``ctx.step``: a ``step {name}`` span.

    A plain context manager (no generator). The span is current while the function runs
    (spans the user's code starts inside the step are its children): the context is
    attached and detached directly, once each.
    """

    __slots__ = ("_span", "_token", "rec")

    def __init__(self, exe: Any, step_no: int, name: str) -> None:
        self.rec = Attempt()
        self._span: trace.Span | None = None
        self._token: Any = None
        tracer = _recording_tracer()
        if tracer is not None:
            self._span = tracer.start_span(
                f"{sc.SPAN_STEP} {name}",
                attributes={
                    sc.RUN_ID: exe.run.id,
                    sc.STEP_NO: step_no,
                    sc.STEP_KIND: "step",
                    sc.STEP_REPLAYED: False,
                },
            )

    def __enter__(self) -> Attempt:
        if self._span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self.rec

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        span = self._span
        if span is None:
            return
        otel_context.detach(self._token)
        outcome = self.rec.resolution or "interrupted"  # the caller sets succeeded / failed
        ending: dict[str, Any] = {sc.STEP_OUTCOME: outcome}
        status = None
        if outcome != "succeeded":
            ending[sc.ERROR_TYPE] = str(self.rec.extra.get("error_class") or outcome)
            status = Status(StatusCode.ERROR)
        _end(span, ending, status)


def workflow_step(exe: Any, step_no: int, name: str) -> WorkflowStep:
    """The first pass of a workflow's ``ctx.step`` (:class:`WorkflowStep`)."""
    return WorkflowStep(exe, step_no, name)


@contextlib.contextmanager
def model_attempt(exe: Any, model: Any) -> Iterator[Attempt]:
    """One model attempt: the ``chat {model}`` span and the ``gen_ai.client.*`` metrics."""
    rec = Attempt()
    provider = str(getattr(model, "provider", "") or model.name)
    requested = str(getattr(model, "model", "") or model.name)
    started = time.perf_counter()
    span = None
    tracer = _recording_tracer()
    if tracer is not None:
        attributes: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_PROVIDER_NAME: provider,
            sc.GEN_AI_REQUEST_MODEL: requested,
            sc.RUN_ID: exe.run.id,
            sc.STEP_KIND: "model",
            sc.STEP_REPLAYED: False,
        }
        step_no = _MODEL_STEP.get()
        if step_no is not None:
            attributes[sc.STEP_NO] = step_no
        span = tracer.start_span(
            f"{sc.OP_CHAT} {requested}", kind=SpanKind.CLIENT, attributes=attributes
        )
    error: str | None = None
    ending: dict[str, Any] = {}
    status: Status | None = None
    try:
        yield rec
    except BaseException as exc:
        error = str(getattr(exc, "error_class", None) or type(exc).__name__)
        ending[sc.ERROR_TYPE] = error
        status = Status(StatusCode.ERROR, str(exc)[:200])
        raise
    finally:
        elapsed = time.perf_counter() - started
        _child("OPERATION_DURATION", sc.OP_CHAT, provider, requested, error or "").observe(elapsed)
        response = rec.response
        if response is not None:
            usage = response.usage
            tokens = ("TOKEN_USAGE", sc.OP_CHAT, provider, requested)
            _child(*tokens, sc.TOKEN_TYPE_INPUT).observe(usage.input_tokens)
            _child(*tokens, sc.TOKEN_TYPE_OUTPUT).observe(usage.output_tokens)
            if span is not None:
                ending[sc.GEN_AI_RESPONSE_MODEL] = response.model or requested
                ending[sc.GEN_AI_USAGE_INPUT_TOKENS] = usage.input_tokens
                ending[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = usage.output_tokens
                ending[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [response.finish_reason]
                if capture_content():
                    ending[sc.GEN_AI_OUTPUT_MESSAGES] = str(response.message)[:10000]
        if span is not None:
            _end(span, ending, status)


def install() -> None:
    """Make these the engine's hooks (:mod:`agentledger.engine._hooks`): done when
    :mod:`agentledger.observe` is imported."""
    hooks.install(
        run_span=run_span,
        set_outcome=set_outcome,
        tool_attempt=tool_attempt,
        replayed_step=replayed_step,
        model_step_scope=model_step_scope,
        workflow_step=workflow_step,
        model_attempt=model_attempt,
    )
