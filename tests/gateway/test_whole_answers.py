"""Model answers are whole or not at all, and spend cannot be dodged: a stream that ends
without the provider's finish signal is a failed attempt (retried, then the fallback),
never the answer; an attempt that may have reached the provider counts at its
reservation unless the provider reported its usage; an answer without usage is counted
by the gateway's estimate, so the run's and the tenant's budgets bind whatever the
provider reports. Real SDKs against the fake providers over loopback HTTP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agentledger._budget import Budget
from agentledger.gateway import _queries as gateway_budgets
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import Harness
from tests.gateway.fakes import (
    FakeProviders,
    Reply,
    anthropic_answer,
    anthropic_stream,
    openai_answer,
    openai_stream,
)
from tests.gateway.test_gateway import close, model_steps, run_once
from tests.gateway.worker_app import make_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

OPENAI, ANTHROPIC = "openai:gpt-4.1-mini", "anthropic:claude-sonnet-4-5"
PATHS = {OPENAI: "/v1/chat/completions", ANTHROPIC: "/v1/messages"}
STREAMS: dict[str, Callable[..., Reply]] = {OPENAI: openai_stream, ANTHROPIC: anthropic_stream}
WHOLE = "Your refund of 240 EUR was NOT approved."


async def parked_why(h: Harness, run_id: str) -> str:
    parked = [e for e in await h.events(run_id) if e.type == "run.parked"]
    return str(parked[-1].data["why"]) if parked else ""


@pytest.mark.parametrize(("primary", "fallback"), [(OPENAI, ANTHROPIC), (ANTHROPIC, OPENAI)])
async def test_a_stream_ending_without_its_finish_signal_is_retried_then_falls_back(
    fake: FakeProviders,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    primary: str,
    fallback: str,
) -> None:
    """The connection closes cleanly after some text (no finish reason, no ``[DONE]``,
    no ``message_stop``): the run never completes on the truncated text."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    truncated = STREAMS[primary](["Your refund of 240 "], finished=False)
    fake.script(truncated, truncated, truncated, STREAMS[fallback]([WHOLE]))
    h, run_id = await run_once(tmp_path, f"{primary} -> {fallback}")
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert run.result == {"answer": WHOLE}
        assert [r["path"] for r in fake.requests] == [PATHS[primary]] * 3 + [PATHS[fallback]]
        (step,) = model_steps(await h.journal(run_id))
        attempts = step.output["attempts"]
        assert [a["error_class"] for a in attempts] == ["incomplete_answer"] * 3 + [None]
        assert step.output["message"]["content"] == WHOLE
        # Each cut-short attempt reached the provider and reported nothing: its reservation.
        for cut in attempts[:3]:
            assert cut["usage_source"] == "estimated"
            assert cut["cost_usd"] == cut["reserved_usd"] > 0
        assert attempts[-1]["usage_source"] == "reported"
        assert step.cost_usd == pytest.approx(sum(a["cost_usd"] for a in attempts))
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_streams_dropped_mid_answer_count_at_their_reservation_and_the_tenant_budget_binds(
    fake: FakeProviders,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store_url: str,
    model: str,
) -> None:
    """A tenant budget that fits two calls lets exactly two dropped streams through."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    dropped = STREAMS[model](["Your refund of 240 "], cut=True)
    h = Harness(tmp_path, make_app(model), store_url)
    async with h:
        # A tenant without limits learns what one call reserves (same prompt, same worst case).
        fake.script(dropped, STREAMS[model]([WHOLE]))
        probe = await h.app.submit(h.store, "concierge", {"message": "Refund?"}, tenant_id="probe")
        await h.drive(probe)
        assert (await h.run(probe)).result == {"answer": WHOLE}
        (step,) = model_steps(await h.journal(probe))
        cut, answered = step.output["attempts"]
        assert cut["error_class"] == "incomplete_answer" and cut["usage_source"] == "estimated"
        reserved = cut["reserved_usd"]
        assert cut["cost_usd"] == reserved > 0
        assert step.cost_usd == pytest.approx(reserved + answered["cost_usd"])

        await h.store.transact(
            gateway_budgets.set_tenant_budget, "acme", 86_400, max_spend_usd=reserved * 2.5
        )
        fake.reset()
        fake.script(*[dropped] * 6)
        run_id = await h.app.submit(h.store, "concierge", {"message": "Refund?"}, tenant_id="acme")
        await h.execute(run_id)
        run = await h.run(run_id)
        assert len(fake.requests) == 2
        assert run.status == RunStatus.WAITING, run
        assert "tenant acme spend limit" in await parked_why(h, run_id)
        assert run.cost_usd == pytest.approx(2 * reserved)
        row = await h.store.transact(
            gateway_budgets.reserve_tenant_usage, "acme", h.clock.now(), 0.0, 0
        )
        assert row is not None and row["spend_usd"] == pytest.approx(2 * reserved)
        await close(h)


def _unreported(model: str, streamed: bool) -> Reply:
    if streamed:
        return STREAMS[model]([WHOLE], usage=None)
    if model == OPENAI:
        return openai_answer(WHOLE, usage=None)
    return anthropic_answer(WHOLE, usage=None)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_an_answer_without_usage_is_counted_by_estimate_and_the_tenant_tokens_bind(
    fake: FakeProviders,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store_url: str,
    model: str,
    streamed: bool,
) -> None:
    if streamed:
        monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(_unreported(model, streamed), _unreported(model, streamed))
    h = Harness(tmp_path, make_app(model), store_url)
    async with h:
        first = await h.submit("concierge", {"message": "Refund?"})
        run = await h.drive(first)
        assert run.status == RunStatus.COMPLETED and run.result == {"answer": WHOLE}
        (step,) = model_steps(await h.journal(first))
        attempt = step.output["attempts"][-1]
        assert attempt["usage_source"] == "estimated"
        assert step.output["usage"]["source"] == "estimated"
        reserved = attempt["reserved_tokens"]
        # The gateway's count: the prompt's estimate plus the answer's, under the worst case.
        assert 0 < step.tokens < reserved and step.output["usage"]["output_tokens"] > 0
        assert step.cost_usd > 0 and run.tokens == step.tokens

        # A tenant limit with room for the next call only if the first had been free.
        await h.store.transact(
            gateway_budgets.set_tenant_budget,
            "default",
            86_400,
            max_tokens=reserved + step.tokens // 2,
        )
        second = await h.submit("concierge", {"message": "Refund?"})
        await h.execute(second)
        assert (await h.run(second)).status == RunStatus.WAITING
        assert len(fake.requests) == 1
        assert "tenant default token limit" in await parked_why(h, second)
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_a_run_token_budget_binds_when_the_provider_omits_usage(
    fake: FakeProviders, tmp_path: Path, model: str
) -> None:
    """A model that keeps calling a tool, never reporting usage: the run's token budget
    hands it over as it would with usage reported, long before its step budget."""
    if model == OPENAI:
        call = openai_answer(calls=[("lookup", '{"city": "Lisbon"}')], usage=None)
    else:
        call = anthropic_answer(calls=[("lookup", {"city": "Lisbon"})], usage=None)
    fake.script(*[call] * 40)
    budget = Budget(max_tokens=3000, max_steps=80, max_spend_usd=100.0)
    h, run_id = await run_once(tmp_path, model, budget=budget)
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        assert "tokens: not sent" in (run.handover_reason or "")
        steps = model_steps(await h.journal(run_id))
        sent = [s for s in steps if s.output.get("message")]
        assert len(fake.requests) == len(sent) < 20
        assert all(s.output["usage"]["source"] == "estimated" for s in sent)
        assert run.tokens == sum(s.tokens for s in steps) > 0
    finally:
        await close(h)


async def test_an_error_event_inside_a_stream_is_a_cut_answer_retried_not_a_rejection(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anthropic sends ``event: error`` (overloaded) after some text of a 200 stream: the
    attempt is an incomplete answer (retried, counted at its reservation), not a
    rejected request that hands the run over."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    broken = anthropic_stream(["Your refund of 240 "], finished=False)
    assert broken.sse is not None
    broken.sse.append({"type": "error", "error": {"type": "overloaded_error", "message": "Busy"}})
    fake.script(broken, anthropic_stream([WHOLE]))
    h, run_id = await run_once(tmp_path, ANTHROPIC)
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert run.result == {"answer": WHOLE}
        (step,) = model_steps(await h.journal(run_id))
        cut, answered = step.output["attempts"]
        assert cut["error_class"] == "incomplete_answer" and "Busy" in cut["error"]
        assert cut["cost_usd"] == cut["reserved_usd"] > 0
        assert answered["usage_source"] == "reported"
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_an_unusable_answer_that_reported_usage_counts_at_that_usage(
    fake: FakeProviders, tmp_path: Path, model: str
) -> None:
    """An empty answer with usage: the provider billed it, so its reported usage counts
    (not 0, not the reservation), and the next model answers."""
    if model == OPENAI:
        empty, chain = openai_answer("", usage=(300, 7, 0)), f"{OPENAI} -> {ANTHROPIC}"
    else:
        empty, chain = anthropic_answer("", usage=(300, 7, 0)), f"{ANTHROPIC} -> {OPENAI}"
    fallback = anthropic_answer(WHOLE) if model == OPENAI else openai_answer(WHOLE)
    fake.script(empty, fallback)
    h, run_id = await run_once(tmp_path, chain)
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": WHOLE}
        (step,) = model_steps(await h.journal(run_id))
        failed = step.output["attempts"][0]
        assert failed["error_class"] == "invalid_response"
        assert failed["usage_source"] == "reported" and failed["tokens"] == 307
        assert 0 < failed["cost_usd"] < failed["reserved_usd"]
    finally:
        await close(h)


async def test_anthropic_streamed_tool_use_is_read_from_the_raw_events(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text and parallel tool_use blocks, their inputs in pieces: the calls run with the
    whole inputs, malformed JSON is fed back as invalid arguments, and the usage of
    ``message_start`` and ``message_delta`` is what the step reports."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    calls = [("lookup", '{"city": "Lisbon"}'), ("lookup", '{"city": "Por')]
    fake.script(anthropic_stream(["Looking. "], (70, 15), calls=calls), anthropic_stream([WHOLE]))
    h, run_id = await run_once(tmp_path, ANTHROPIC)
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": WHOLE}
        second = fake.requests[1]["body"]["messages"]
        assert second[1]["content"][0] == {"type": "text", "text": "Looking. "}
        assert second[1]["content"][1]["input"] == {"city": "Lisbon"}
        results = second[-1]["content"]
        assert [b["tool_use_id"] for b in results] == ["toolu_1", "toolu_2"]
        assert "Lisbon" in results[0]["content"] and "invalid_arguments" in results[1]["content"]
        first = model_steps(await h.journal(run_id))[0].output
        assert first["finish_reason"] == "tool_calls"
        assert first["usage"] == {
            "input_tokens": 70,
            "output_tokens": 15,
            "cached_tokens": 0,
            "source": "reported",
            "simulated": False,
        }
    finally:
        await close(h)


@pytest.mark.parametrize(
    ("usage", "source"),
    [((-500, -20, 0), "estimated"), ((0, 0, 0), "estimated"), ((10**30, 5, 10**31), "reported")],
    ids=["negative", "zero", "huge"],
)
async def test_hostile_usage_never_makes_a_call_free_or_breaks_the_journal(
    fake: FakeProviders, tmp_path: Path, usage: tuple[int, int, int], source: str
) -> None:
    """Negative or zero counts for a real answer are not counts: the gateway's estimate
    stands in. A count too large for the store is capped (and still binds)."""
    from agentledger.models._provider import MAX_TOKENS_COUNTED

    fake.script(openai_answer(WHOLE, usage=usage))
    h, run_id = await run_once(tmp_path, OPENAI)
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": WHOLE}
        (step,) = model_steps(await h.journal(run_id))
        assert step.output["usage"]["source"] == source
        assert step.tokens > 0 and step.cost_usd > 0 and run.tokens == step.tokens
        if source == "reported":
            assert step.output["usage"]["input_tokens"] == MAX_TOKENS_COUNTED
            assert step.output["usage"]["cached_tokens"] == MAX_TOKENS_COUNTED
            assert step.tokens == MAX_TOKENS_COUNTED + 5
    finally:
        await close(h)


async def test_a_listener_is_told_which_attempt_each_delta_belongs_to(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live deltas of a stream cut short, then of the retry that answered: each names its
    attempt, so a listener knows to drop the truncated text."""
    from agentledger.gateway import _stream as stream
    from agentledger.service._deltas import frame

    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(openai_stream(["Your refund of 240 "], finished=False), openai_stream([WHOLE]))
    h = Harness(tmp_path, make_app(OPENAI))
    async with h:
        run_id = await h.submit("concierge", {"message": "Refund?"})
        queue = stream.subscribe(run_id)
        try:
            await h.drive(run_id)
        finally:
            stream.unsubscribe(run_id, queue)
        deltas = [queue.get_nowait() for _ in range(queue.qsize())]
        assert [(d["attempt"], d["text"]) for d in deltas] == [
            (1, "Your refund of 240 "),
            (2, WHOLE),
        ]
        assert '"attempt": 2' in frame(deltas[-1])
        assert (await h.run(run_id)).result == {"answer": WHOLE}
        await close(h)
