"""Spans of model steps and ``ctx.step`` steps across a kill and a resume: one trace,
``chat {model}`` spans with the GenAI attributes, replayed steps marked, and tokens
counted once (issue 11, item 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentledger import App
from agentledger.observe import _semconv as sc
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import KILLED, Harness
from tests.observe.apps import Payments, booking_agent_app, journal_app
from tests.observe.test_tracing import spans  # noqa: F401  (the fixture)


def _of(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.attributes.get(sc.RUN_ID) == run_id]


async def test_model_steps_traced_once_across_a_resume(
    tmp_path: Path,
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    payments = Payments(kill_after_apply=True)
    async with Harness(tmp_path, booking_agent_app(payments)) as h:
        run_id = await h.submit("booker", {"message": "book Paris"})
        assert await h.execute(run_id, owner="w1") == KILLED
        assert await h.execute(run_id, owner="w2") == RunStatus.COMPLETED
        run = await h.run(run_id)
    found = _of(spans, run_id)
    assert len({s.context.trace_id for s in found}) == 1  # one trace across both executions
    assert [s.name for s in found].count("invoke_agent booker") == 2
    chats = [s for s in found if s.name == "chat scripted-booker"]
    fresh = [s for s in chats if not s.attributes[sc.STEP_REPLAYED]]
    replayed = [s for s in chats if s.attributes[sc.STEP_REPLAYED]]
    # First execution: model steps 1 and 3 (killed in the payment, step 4). Second: both
    # answered from the journal, then model step 5 is a new call.
    assert len(fresh) == 3 and len(replayed) == 2
    assert sorted(s.attributes[sc.STEP_NO] for s in replayed) == [1, 3]
    assert sorted(s.attributes[sc.STEP_NO] for s in fresh) == [1, 3, 5]
    for span in chats:
        attrs = span.attributes
        assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat"
        assert attrs[sc.GEN_AI_PROVIDER_NAME]
        assert attrs[sc.GEN_AI_REQUEST_MODEL] == "scripted-booker"
        assert attrs[sc.GEN_AI_RESPONSE_MODEL] == "scripted-booker"
        assert tuple(attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) in (("tool_calls",), ("stop",))
    for span in fresh:
        assert span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] > 0
        assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
    for span in replayed:  # never counted as new usage
        assert sc.GEN_AI_USAGE_INPUT_TOKENS not in span.attributes
        assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in span.attributes
    counted = sum(
        int(s.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS])
        + int(s.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS])
        for s in fresh
    )
    assert run.tokens > 0 and counted == run.tokens
    # The chat spans of one execution are children of that execution's run span.
    runs = {s.context.span_id for s in found if s.name == "invoke_agent booker"}
    assert all(s.parent is not None and s.parent.span_id in runs for s in chats)
    assert len(payments.charges) == 1


async def test_workflow_steps_replayed_are_marked(
    tmp_path: Path,
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    async with Harness(tmp_path, journal_app()) as h:
        run_id = await h.submit("steps")
        assert await h.execute(run_id, owner="w1") == KILLED
        assert await h.execute(run_id, owner="w2") == RunStatus.COMPLETED
    found = _of(spans, run_id)
    steps = [(s.name, s.attributes[sc.STEP_REPLAYED]) for s in found if s.name.startswith("step ")]
    assert sorted(steps) == [
        ("step first", False),
        ("step first", True),
        ("step second", False),
        ("step second", False),
    ]
    first = [s for s in found if s.name == "step first" and s.attributes[sc.STEP_REPLAYED]]
    assert first[0].attributes[sc.STEP_NO] == 1
    assert first[0].attributes[sc.STEP_OUTCOME] == "succeeded"


async def test_spans_the_users_code_starts_inside_a_step_are_its_children(
    tmp_path: Path,
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    app = App("observe-nested")
    seen: dict[str, Any] = {}

    def traced() -> int:
        with trace.get_tracer("users-code").start_as_current_span("users span"):
            return 1

    @app.workflow(name="nested")
    async def nested(ctx: Any, input: Any) -> Any:
        value = await ctx.step("outer", traced)
        seen["after"] = trace.get_current_span().get_span_context().span_id  # the run span
        return value

    async with Harness(tmp_path, app) as h:
        run_id = await h.submit("nested")
        assert await h.execute(run_id, owner="w1") == RunStatus.COMPLETED
    found = _of(spans, run_id)
    step = next(s for s in found if s.name == "step outer")
    run = next(s for s in found if s.name == "invoke_workflow nested")
    users = next(s for s in spans.get_finished_spans() if s.name == "users span")
    assert users.parent is not None and users.parent.span_id == step.context.span_id
    assert step.parent is not None and step.parent.span_id == run.context.span_id
    assert seen["after"] == run.context.span_id  # the step's span is detached once it ends
