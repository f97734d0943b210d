"""The model gateway through the engine, against fake providers over real HTTP, driven
by the real ``openai`` and ``anthropic`` SDKs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentledger._budget import Budget
from agentledger.gateway import _queries as gateway_budgets
from agentledger.gateway._cooldown import COOLDOWNS
from agentledger.models._pricing import genai_prices_version
from agentledger.records import RunStatus, StepStatus
from tests.fast.lifecycle_harness import Harness
from tests.gateway.fakes import (
    FakeProviders,
    anthropic_answer,
    anthropic_stream,
    error,
    openai_answer,
    openai_stream,
)
from tests.gateway.worker_app import make_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def run_once(tmp_path: Path, model: Any, **kw: Any) -> tuple[Harness, str]:
    h = Harness(tmp_path, make_app(model, kw.get("budget")))
    await h.__aenter__()
    run_id = await h.submit("concierge", {"message": "Hotels in Lisbon?"})
    await h.drive(run_id)
    return h, run_id


async def close(h: Harness) -> None:
    for definition in h.app.definitions.values():
        closer = getattr(getattr(definition, "model", None), "aclose", None)
        if closer is not None:
            await closer()
    await h.__aexit__()


def model_steps(journal: list[Any]) -> list[Any]:
    return [s for s in journal if s.kind == "model"]


async def test_openai_tool_calls_and_answer_are_journaled_with_tokens_and_cost(
    fake: FakeProviders, tmp_path: Path
) -> None:
    fake.script(
        openai_answer(
            calls=[("lookup", '{"city": "Lisbon"}'), ("lookup", '{"city": "Porto"}')],
            usage=(120, 30, 100),
        ),
        openai_answer("Three hotels in each.", usage=(200, 10, 0)),
    )
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini")
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert run.result == {"answer": "Three hotels in each."}
        assert len(fake.requests) == 2  # one per model step: the SDK retried nothing
        second = fake.requests[1]["body"]
        tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in tool_msgs] == ["call_0", "call_1"]
        assert second["tools"][0]["function"]["name"] == "lookup"
        steps = model_steps(await h.journal(run_id))
        first = steps[0].output
        assert first["provider"] == "openai" and first["model"] == "gpt-4.1-mini"
        assert first["usage"] == {
            "input_tokens": 120,
            "output_tokens": 30,
            "cached_tokens": 100,
            "source": "reported",
            "simulated": False,
        }
        assert first["prices"] == f"genai-prices {genai_prices_version()}"
        # 20 plain input at $0.4/M, 100 cached at $0.1/M, 30 output at $1.6/M
        expected = (20 * 0.4 + 100 * 0.1 + 30 * 1.6) / 1e6
        assert steps[0].cost_usd == pytest.approx(expected)
        assert steps[0].tokens == 150
        assert [a["error_class"] for a in first["attempts"]] == [None]
        assert first["attempts"][0]["usage_source"] == "reported"
        assert run.cost_usd == pytest.approx(sum(s.cost_usd for s in steps))
        # The key never reaches the journal or the events.
        dump = json.dumps([s.to_dict() for s in await h.journal(run_id)], default=str)
        dump += json.dumps([e.data for e in await h.events(run_id)], default=str)
        assert "sk-test-secret-key" not in dump
    finally:
        await close(h)


async def test_anthropic_parallel_tool_use_maps_both_ways(
    fake: FakeProviders, tmp_path: Path
) -> None:
    fake.script(
        anthropic_answer(calls=[("lookup", {"city": "Lisbon"}), ("lookup", {"city": "Porto"})]),
        anthropic_answer("Done with both."),
    )
    h, run_id = await run_once(tmp_path, "anthropic:claude-sonnet-4-5")
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.COMPLETED, run
        body = fake.requests[1]["body"]
        assert body["system"] == "Find hotels."
        assert body["tools"][0]["input_schema"]["properties"]["city"]
        results = body["messages"][-1]
        assert results["role"] == "user"  # both tool results in one user turn
        assert [b["tool_use_id"] for b in results["content"]] == ["toolu_0", "toolu_1"]
        assert body["messages"][1]["content"][0]["input"] == {"city": "Lisbon"}
        assert len(fake.requests) == 2
        steps = model_steps(await h.journal(run_id))
        assert steps[0].output["provider"] == "anthropic"
        assert steps[0].cost_usd == pytest.approx((100 * 3 + 20 * 15) / 1e6)
    finally:
        await close(h)


async def test_malformed_tool_call_json_is_fed_back_as_invalid_arguments(
    fake: FakeProviders, tmp_path: Path
) -> None:
    fake.script(openai_answer(calls=[("lookup", '{"city": "Lis')]), openai_answer("Sorry."))
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini")
    try:
        assert (await h.run(run_id)).status == RunStatus.COMPLETED
        fed_back = [m for m in fake.requests[1]["body"]["messages"] if m["role"] == "tool"]
        assert "invalid_arguments" in fed_back[0]["content"]
    finally:
        await close(h)


async def test_refusal_fails_the_run_without_retry(fake: FakeProviders, tmp_path: Path) -> None:
    fake.script(openai_answer(refusal="I can't help with that."))
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini")
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.FAILED and "refused" in (run.error or "")
        assert len(fake.requests) == 1
    finally:
        await close(h)


async def test_content_filter_fails_at_once(fake: FakeProviders, tmp_path: Path) -> None:
    fake.script(openai_answer("", finish="content_filter"))
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini -> anthropic:claude-sonnet-4-5")
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.FAILED and "content filter" in (run.error or "")
        assert len(fake.requests) == 1  # no fallback on a content filter
    finally:
        await close(h)


async def test_429_retry_after_is_honoured_then_answers(
    fake: FakeProviders, tmp_path: Path
) -> None:
    fake.script(error(429, "slow down", retry_after="1"), openai_answer("Fine."))
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini")
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.COMPLETED
        assert len(fake.requests) == 2  # our one retry; the SDK made none
        (step,) = model_steps(await h.journal(run_id))
        assert [a["error_class"] for a in step.output["attempts"]] == ["rate_limited", None]
        assert step.output["retry"]["rate_limited"] == 1
    finally:
        await close(h)


@pytest.mark.parametrize(
    ("failure", "falls_back"),
    [
        (error(500, "boom"), True),
        (error(400, "maximum context length is 8192 tokens", code="context_length_exceeded"), True),
        (openai_answer(""), True),  # empty answer
        (error(429, "later", retry_after="600"), True),  # beyond 60 s: fall back at once
        (error(401, "bad key"), False),
        (error(404, "no such model"), False),
        (error(422, "unprocessable"), False),
        (error(400, "bad request"), False),
    ],
    ids=["500", "context", "empty", "429-long", "401", "404", "422", "400"],
)
async def test_failover_happens_exactly_on_its_classes(
    fake: FakeProviders, tmp_path: Path, failure: Any, falls_back: bool
) -> None:
    retried = failure.status >= 500
    fake.script(*([failure] * (3 if retried else 1)), anthropic_answer("From the fallback."))
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini -> anthropic:claude-sonnet-4-5")
    try:
        run = await h.run(run_id)
        paths = [r["path"] for r in fake.requests]
        (step,) = model_steps(await h.journal(run_id))
        if falls_back:
            assert run.status == RunStatus.COMPLETED, run
            assert run.result == {"answer": "From the fallback."}
            assert paths[-1] == "/v1/messages"
            assert paths.count("/v1/chat/completions") == (3 if retried else 1)
            assert step.output["provider"] == "anthropic"
            assert step.output["attempts"][-1]["provider"] == "anthropic"
        else:
            assert run.status == RunStatus.NEEDS_HUMAN, run
            assert paths == ["/v1/chat/completions"]  # at once: no retry, no fallback
            assert step.status == StepStatus.FAILED and step.error_class == "model_rejected"
            assert str(failure.status) in (run.handover_reason or "")
    finally:
        await close(h)


async def test_slow_answer_past_the_timeout_is_retried_once_then_falls_back(
    fake: FakeProviders, tmp_path: Path
) -> None:
    from agentledger.models._anthropic import AnthropicModel
    from agentledger.models._fallback import FallbackModel
    from agentledger.models._openai import OpenAIModel

    slow = openai_answer("late")
    slow.delay = 2.0
    # By endpoint: an OpenAI attempt cut off before its request reached the server (a
    # loaded host) must not leave the late answer to the fallback.
    fake.script_for("/v1/chat/completions", slow, slow)
    fake.script_for("/v1/messages", anthropic_answer("Fast."))
    model = FallbackModel(
        [OpenAIModel("gpt-4.1-mini", timeout=0.3), AnthropicModel("claude-sonnet-4-5")]
    )
    h, run_id = await run_once(tmp_path, model)
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.COMPLETED, run.handover_reason
        (step,) = model_steps(await h.journal(run_id))
        classes = [a["error_class"] for a in step.output["attempts"]]
        assert classes == ["timeout", "timeout", None]
        # A call cut off by the timeout stays counted at its reservation.
        assert step.output["attempts"][0]["cost_usd"] == step.output["attempts"][0]["reserved_usd"]
        assert step.cost_usd > step.output["attempts"][-1]["cost_usd"]
    finally:
        await close(h)


async def test_streaming_forwards_deltas_and_journals_the_final_message(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentledger.gateway import _stream as stream

    seen: list[str] = []
    monkeypatch.setattr(stream, "publish", lambda run_id, step_no, text, *_: seen.append(text))
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(openai_stream(["Three ", "hotels."]))
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini")
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": "Three hotels."}
        assert seen == ["Three ", "hotels."]
        assert fake.requests[0]["body"]["stream"] is True
        (step,) = model_steps(await h.journal(run_id))
        assert step.output["message"]["content"] == "Three hotels."
        assert step.output["usage"]["input_tokens"] == 50
    finally:
        await close(h)


async def test_anthropic_streaming_forwards_deltas_and_journals_only_the_final_message(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deltas reach a listener of the run (the in-process stream) as they arrive; the
    journal and the run's events hold the final message only, never a delta."""
    import asyncio

    from agentledger.gateway import _stream as stream

    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(anthropic_stream(["Free ", "cancellation ", "until noon."]))
    h = Harness(tmp_path, make_app("anthropic:claude-sonnet-4-5"))
    async with h:
        run_id = await h.submit("concierge", {"message": "Can I cancel?"})
        queue = stream.subscribe(run_id)
        try:
            await h.drive(run_id)
            deltas = []
            while not queue.empty():
                deltas.append(queue.get_nowait())
        finally:
            stream.unsubscribe(run_id, queue)
        assert isinstance(queue, asyncio.Queue)
        assert [d["text"] for d in deltas] == ["Free ", "cancellation ", "until noon."]
        assert {d["type"] for d in deltas} == {"model.delta"}
        run = await h.run(run_id)
        assert run.result == {"answer": "Free cancellation until noon."}
        assert fake.requests[0]["path"] == "/v1/messages"
        assert fake.requests[0]["body"]["stream"] is True
        (step,) = model_steps(await h.journal(run_id))
        assert step.output["message"]["content"] == "Free cancellation until noon."
        assert step.output["usage"]["input_tokens"] == 60
        assert step.output["usage"]["output_tokens"] == 12
        assert step.output["usage"]["source"] == "reported"
        journaled = json.dumps([s.output for s in await h.journal(run_id)])
        journaled += json.dumps([e.data for e in await h.events(run_id)])
        assert "model.delta" not in journaled
        assert journaled.count("Free cancellation until noon.") >= 1
        assert '"Free "' not in journaled and 'cancellation "' not in journaled
        await close(h)


async def test_a_model_failing_repeatedly_is_cooled_down_and_skipped(
    fake: FakeProviders, tmp_path: Path
) -> None:
    fake.script(*[error(503, "overloaded")] * 3, anthropic_answer("B."), anthropic_answer("C."))
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini -> anthropic:claude-sonnet-4-5")
    try:
        assert (await h.run(run_id)).status == RunStatus.COMPLETED
        events = [e for e in await h.events(run_id) if e.type == "model.cooldown"]
        assert len(events) == 1 and events[0].actor == "openai:gpt-4.1-mini"
        # The next run skips the cooled model: no request reaches it.
        before = len(fake.requests)
        run2 = await h.submit("concierge", {"message": "again"})
        await h.drive(run2)
        assert [r["path"] for r in fake.requests[before:]] == ["/v1/messages"]
        (step,) = model_steps(await h.journal(run2))
        assert step.output["attempts"][0]["skipped"] == "cooldown"
    finally:
        await close(h)
        COOLDOWNS.reset()


async def test_a_run_whose_next_call_could_exceed_its_budget_is_not_sent(
    fake: FakeProviders, tmp_path: Path
) -> None:
    budget = Budget(max_spend_usd=0.0001)  # below the worst case of one call
    h, run_id = await run_once(tmp_path, "anthropic:claude-sonnet-4-5", budget=budget)
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN
        assert "not sent" in (run.handover_reason or "")
        assert fake.requests == []
    finally:
        await close(h)


async def test_a_tenant_period_limit_parks_the_run_with_the_reason(
    fake: FakeProviders, tmp_path: Path
) -> None:
    h = Harness(tmp_path, make_app("openai:gpt-4.1-mini"))
    async with h:
        await h.store.transact(
            gateway_budgets.set_tenant_budget, "default", 86_400, max_spend_usd=0.0001
        )
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        await h.execute(run_id)
        run = await h.run(run_id)
        assert run.status == RunStatus.WAITING
        assert fake.requests == []
        parked = [e for e in await h.events(run_id) if e.type == "run.parked"]
        assert "tenant default spend limit" in parked[-1].data["why"]
        assert run.available_at is not None
        # Raised limit: the run goes on from the same step.
        await h.store.transact(
            gateway_budgets.set_tenant_budget, "default", 86_400, max_spend_usd=10.0
        )
        await h.drive(run_id)
        assert (await h.run(run_id)).status == RunStatus.COMPLETED
        assert len(fake.requests) == 1
        # The period's row was settled from the reservation to the real cost.
        row = await h.store.transact(
            gateway_budgets.reserve_tenant_usage, "default", h.clock.now(), 0.0, 0
        )
        assert row is not None
        assert row["spend_usd"] == pytest.approx((await h.run(run_id)).cost_usd)
        await close(h)


async def test_replay_sends_nothing_and_a_lost_call_is_counted(
    fake: FakeProviders, tmp_path: Path
) -> None:
    """A worker killed during a model call: the resumed run sends that call once more,
    never a journaled one, and the lost call's reservation stays in the run's spend."""
    import threading

    hold = threading.Event()
    first = openai_answer(calls=[("lookup", '{"city": "Lisbon"}')])
    lost = openai_answer("never read")
    lost.hold = hold
    fake.script(first, lost, openai_answer("Answer."))
    app = make_app("openai:gpt-4.1-mini")
    h = Harness(tmp_path, app)
    async with h:
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        import asyncio

        task = asyncio.create_task(h.execute(run_id))
        await asyncio.to_thread(fake.wait_requests, 2)
        task.cancel()  # the worker dies mid-call: nothing more is written
        with pytest.raises(asyncio.CancelledError):
            await task
        hold.set()
        journal = {s.step_no: s for s in await h.journal(run_id)}
        inflight = journal[3]
        assert inflight.status == StepStatus.STARTED
        reserved = inflight.output["attempts"][-1]["reserved_usd"]
        assert inflight.cost_usd == reserved > 0
        await h.drive(run_id)
        run = await h.run(run_id)
        assert run.status == RunStatus.COMPLETED
        assert len(fake.requests) == 3  # step 1 never sent again; step 3 once more
        step3 = {s.step_no: s for s in await h.journal(run_id)}[3]
        classes = [a["error_class"] for a in step3.output["attempts"]]
        assert classes == ["lost", None]
        answered = step3.output["attempts"][-1]["cost_usd"]
        assert step3.cost_usd == pytest.approx(reserved + answered)
        assert run.cost_usd == pytest.approx(sum(s.cost_usd for s in await h.journal(run_id)))
        await close(h)


async def test_a_tenant_request_rate_waits_briefly_or_parks_with_the_reason(
    fake: FakeProviders, tmp_path: Path
) -> None:
    """Two model calls at one instant. At 1 request/s the second waits a second in the
    worker; at one per 1000 s it parks with the reason, then goes on when due."""
    two_calls = (openai_answer(calls=[("lookup", '{"city": "Lisbon"}')]), openai_answer("3."))
    h = Harness(tmp_path, make_app("openai:gpt-4.1-mini"))
    async with h:
        await h.store.transact(gateway_budgets.set_tenant_budget, "default", 86_400, max_rps=1.0)
        fake.script(*two_calls)
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        await h.execute(run_id)
        assert (await h.run(run_id)).status == RunStatus.COMPLETED
        assert h.clock.slept and h.clock.slept[-1] == pytest.approx(1.0, abs=0.01)

        await h.store.transact(gateway_budgets.set_tenant_budget, "default", 86_400, max_rps=0.001)
        fake.reset()
        fake.script(*two_calls)
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        await h.execute(run_id)
        run = await h.run(run_id)
        assert run.status == RunStatus.WAITING
        assert len(fake.requests) == 1  # the second call was not sent
        parked = [e for e in await h.events(run_id) if e.type == "run.parked"]
        assert "tenant default request rate limit (0.001/s)" in parked[-1].data["why"]
        await h.drive(run_id)
        assert (await h.run(run_id)).status == RunStatus.COMPLETED
        assert len(fake.requests) == 2
        await close(h)


async def test_a_failed_model_is_named_once_and_its_cooldown_says_what_it_does(
    fake: FakeProviders, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="agentledger")
    fake.script(*[error(503, "overloaded")] * 3)
    h, run_id = await run_once(tmp_path, "openai:gpt-4.1-mini")
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN
        assert run.handover_reason == "model openai:gpt-4.1-mini failed: 503 error overloaded"
        (said,) = [r.getMessage() for r in caplog.records if "cool" in r.getMessage()]
        # The run had no other model: the cooldown is news for other runs, not for it.
        assert said == (
            "model openai:gpt-4.1-mini cooled down: for 30 s this worker's runs skip it "
            "where a fallback model follows; run " + run_id + " had none"
        ), said
    finally:
        await close(h)
        COOLDOWNS.reset()
