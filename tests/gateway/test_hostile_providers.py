"""A hostile or broken provider, over loopback HTTP through the real SDKs: finish reasons
the gateway must not take for a whole answer, usage that must not be double-counted or
dodged, streams that never end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
WHOLE = "Your refund of 240 EUR was NOT approved."
BASE = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1-mini"}


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    *,
    index: int = 0,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One Chat Completions chunk (``delta`` None: a usage-only chunk with no choices)."""
    out: dict[str, Any] = {**BASE, "choices": []}
    if delta is not None:
        out["choices"] = [{"index": index, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        out["usage"] = usage
    return out


def usage(prompt: Any, completion: Any) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": 0}


AMSG: dict[str, Any] = {
    "id": "m",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [],
    "stop_reason": None,
    "stop_sequence": None,
    "usage": {"input_tokens": 60, "output_tokens": 1},
}


def anthropic_events(text: str, stop: str | None, *, calls: list[tuple[str, str]] = ()) -> Reply:  # type: ignore[assignment]
    """A Messages stream that ends with ``message_delta`` (``stop``) and ``message_stop``."""
    events: list[Any] = [
        {"type": "message_start", "message": AMSG},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
    ]
    for i, (name, raw) in enumerate(calls, start=1):
        block = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {}}
        events += [
            {"type": "content_block_start", "index": i, "content_block": block},
            {
                "type": "content_block_delta",
                "index": i,
                "delta": {"type": "input_json_delta", "partial_json": raw},
            },
            {"type": "content_block_stop", "index": i},
        ]
    events += [
        {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 12}},
        {"type": "message_stop"},
    ]
    return Reply(sse=events)


def openai_calls(calls: list[tuple[str, str]], finish: str) -> Reply:
    """Streamed parallel tool calls, then ``finish`` and the usage chunk."""
    events: list[Any] = [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": name, "arguments": raw},
                    }
                ]
            }
        )
        for i, (name, raw) in enumerate(calls)
    ]
    events += [chunk({}, finish), chunk(usage=usage(50, 30))]
    return Reply(sse=events)


CUT = "Your refund of 240 EUR was"


def _not_finished(model: str, reason: str) -> Reply:
    if model == OPENAI:
        return Reply(sse=[chunk({"content": CUT}), chunk({}, reason), chunk(usage=usage(50, 9))])
    return anthropic_events(CUT, reason)


@pytest.mark.parametrize(
    ("model", "reason"),
    [(OPENAI, "error"), (OPENAI, "abort"), (ANTHROPIC, "pause_turn"), (ANTHROPIC, "error")],
)
async def test_a_finish_reason_that_does_not_say_the_answer_is_whole_is_an_incomplete_answer(
    fake: FakeProviders,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    reason: str,
) -> None:
    """Compatible servers end a failed generation with ``finish_reason="error"`` or
    ``"abort"``; ``pause_turn`` asks the caller to continue the turn: none of them is
    the provider saying the answer is whole, so the cut text is never journaled."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fallback, other = (
        (anthropic_stream([WHOLE]), ANTHROPIC)
        if model == OPENAI
        else (openai_stream([WHOLE]), OPENAI)
    )
    fake.script(*[_not_finished(model, reason)] * 3, fallback)
    h, run_id = await run_once(tmp_path, f"{model} -> {other}")
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": WHOLE}, run
        (step,) = model_steps(await h.journal(run_id))
        attempts = step.output["attempts"]
        assert [a["error_class"] for a in attempts] == ["incomplete_answer"] * 3 + [None]
        assert reason in attempts[0]["error"]
        # The provider reported what it billed for each: that, not 0.
        assert all(a["usage_source"] == "reported" and a["tokens"] > 0 for a in attempts[:3])
    finally:
        await close(h)


async def test_only_the_first_choice_is_the_answer(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that streams a second choice (``n`` was never asked for): its text, tool
    calls and finish reason are not mixed into the answer; a second choice that finishes
    never finishes the first."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    mixed = Reply(
        sse=[
            chunk({"content": WHOLE}),
            chunk({"content": " Approved after all."}, index=1),
            chunk({}, "stop"),
            chunk({}, "stop", index=1),
            chunk(usage=usage(50, 9)),
        ]
    )
    only_second = Reply(sse=[chunk({"content": CUT}), chunk({"content": WHOLE}, "stop", index=1)])
    fake.script(mixed, only_second, openai_stream([WHOLE]))
    h, first = await run_once(tmp_path, OPENAI)
    try:
        assert (await h.run(first)).result == {"answer": WHOLE}
        second = await h.submit("concierge", {"message": "Refund?"})
        await h.drive(second)
        assert (await h.run(second)).result == {"answer": WHOLE}
        (step,) = model_steps(await h.journal(second))
        assert [a["error_class"] for a in step.output["attempts"]] == ["incomplete_answer", None]
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_tool_calls_cut_at_max_tokens_are_never_run(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """Parallel calls cut by the token limit: the list and its last arguments are cut, so
    not even the whole first call runs; the attempt is an unusable answer (the next
    model may have room), counted at the usage reported."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    calls = [("lookup", '{"city": "Lisbon"}'), ("lookup", '{"city": "Por')]
    if model == OPENAI:
        cut, other, fallback = openai_calls(calls, "length"), ANTHROPIC, anthropic_stream([WHOLE])
    else:
        cut, other = anthropic_events("Looking.", "max_tokens", calls=calls), OPENAI
        fallback = openai_stream([WHOLE])
    fake.script(cut, fallback)
    h, run_id = await run_once(tmp_path, f"{model} -> {other}")
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": WHOLE}, run
        journal = await h.journal(run_id)
        assert [s.kind for s in journal] == ["model"], "a call of a cut answer ran"
        failed = journal[0].output["attempts"][0]
        assert failed["error_class"] == "invalid_response" and "max_tokens" in failed["error"]
        assert failed["usage_source"] == "reported"
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_an_endless_stream_is_cut_by_the_model_timeout_and_counted_at_its_reservation(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """A provider that sends some text and then keeps the connection alive forever (SSE
    comments, pings): the model's timeout ends each attempt, which counts at its
    reservation, and the run is handed over with the reason once the chain is used up."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    monkeypatch.setenv("AGENTLEDGER_MODEL_TIMEOUT", "0.5")
    if model == OPENAI:
        endless = Reply(sse=[chunk({"content": CUT})], endless=b": keep-alive\n\n", done=False)
    else:
        endless = anthropic_stream([CUT], finished=False)
        endless.endless = b'event: ping\ndata: {"type": "ping"}\n\n'
    fake.script(*[endless] * 2)
    h, run_id = await run_once(tmp_path, model)
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        assert "no answer within" in (run.handover_reason or "")
        (step,) = model_steps(await h.journal(run_id))
        attempts = step.output["attempts"]
        assert [a["error_class"] for a in attempts] == ["timeout"] * len(attempts)
        assert len(attempts) == len(fake.requests) >= 2
        assert all(a["cost_usd"] == a["reserved_usd"] > 0 for a in attempts)
        assert run.cost_usd == pytest.approx(sum(a["cost_usd"] for a in attempts))
    finally:
        await close(h)


async def test_a_chain_of_models_that_all_break_off_hands_over_with_every_attempt_counted(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(
        *[openai_stream([CUT], finished=False)] * 3,
        *[anthropic_stream([CUT], finished=False)] * 3,
    )
    h, run_id = await run_once(tmp_path, f"{OPENAI} -> {ANTHROPIC}")
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        assert "incomplete" in (run.handover_reason or "") or "not an answer" in (
            run.handover_reason or ""
        ), run.handover_reason
        (step,) = model_steps(await h.journal(run_id))
        attempts = step.output["attempts"]
        assert [a["error_class"] for a in attempts] == ["incomplete_answer"] * 6
        assert step.error_class == "incomplete_answer"
        assert all(a["cost_usd"] == a["reserved_usd"] > 0 for a in attempts)
        assert run.cost_usd == pytest.approx(sum(a["cost_usd"] for a in attempts))
        assert "message" not in step.output
    finally:
        await close(h)


@pytest.mark.parametrize("bound", ["run", "tenant"])
@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_usage_far_over_the_reservation_binds_the_run_and_the_tenant_after_the_fact(
    fake: FakeProviders, tmp_path: Path, store_url: str, model: str, bound: str
) -> None:
    """The provider reports 50 million prompt tokens for a tool-calling answer that
    reserved about a thousand: the step and the tenant's period count all of them, and
    the next call is not sent (the run is handed over, or the tenant's runs park)."""
    big = 50_000_000
    if model == OPENAI:
        call = openai_answer(calls=[("lookup", '{"city": "Lisbon"}')], usage=(big, 10, 0))
    else:
        call = anthropic_answer(calls=[("lookup", {"city": "Lisbon"})], usage=(big, 10, 0))
    fake.script(call, call, call)
    budget = Budget(max_spend_usd=10_000.0, max_tokens=10**9 if bound == "tenant" else 10_000)
    h = Harness(tmp_path, make_app(model, budget), store_url)
    async with h:
        await h.store.transact(
            gateway_budgets.set_tenant_budget,
            "acme",
            86_400,
            max_tokens=None if bound == "run" else 10_000,
        )
        first = await h.app.submit(h.store, "concierge", {"message": "Hotels?"}, tenant_id="acme")
        await h.execute(first)
        steps = model_steps(await h.journal(first))
        assert steps[0].tokens == big + 10 and steps[0].output["usage"]["source"] == "reported"
        assert len(fake.requests) == 1, "the next call went out over the budget"
        run = await h.run(first)
        assert run.tokens == big + 10
        if bound == "run":
            assert run.status == RunStatus.NEEDS_HUMAN and "budget" in (run.handover_reason or "")
            return await close(h)
        row = await h.store.transact(
            gateway_budgets.reserve_tenant_usage, "acme", h.clock.now(), 0.0, 0
        )
        assert row is not None and row["tokens"] == big + 10
        assert run.status == RunStatus.WAITING
        second = await h.app.submit(h.store, "concierge", {"message": "Hotels?"}, tenant_id="acme")
        await h.execute(second)
        assert (await h.run(second)).status == RunStatus.WAITING
        assert len(fake.requests) == 1
        await close(h)


@pytest.mark.parametrize("usage_sent", [True, False], ids=["usage-sent", "usage-lost"])
async def test_a_stream_dropped_after_its_finish_reason_is_the_answer(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usage_sent: bool
) -> None:
    """The provider said the answer was finished, then the connection broke before
    ``[DONE]``: the answer is whole, so it is journaled once (not sent again and billed
    twice), at the usage reported or, when the usage chunk was lost too, the estimate."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    events: list[Any] = [chunk({"content": WHOLE}), chunk({}, "stop")]
    if usage_sent:
        events.append(chunk(usage=usage(50, 9)))
    fake.script(Reply(sse=events, done=False, cut=True), openai_stream(["Another answer."]))
    h, run_id = await run_once(tmp_path, OPENAI)
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": WHOLE}, run
        assert len(fake.requests) == 1
        (step,) = model_steps(await h.journal(run_id))
        (attempt,) = step.output["attempts"]
        assert attempt["error_class"] is None
        assert attempt["usage_source"] == ("reported" if usage_sent else "estimated")
        assert step.output["finish_reason"] == "stop"
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_a_stream_dropped_before_its_finish_signal_is_an_incomplete_answer(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """The connection breaks mid-answer (Anthropic: after ``message_delta`` gave its stop
    reason, before ``message_stop``): the class says the answer broke off."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    if model == OPENAI:
        cut = openai_stream([CUT], cut=True)
        whole = openai_stream([WHOLE])
    else:
        cut = anthropic_events(CUT, "end_turn")
        assert cut.sse is not None
        cut.sse.pop()  # no message_stop
        cut.cut = True
        whole = anthropic_stream([WHOLE])
    fake.script(cut, whole)
    h, run_id = await run_once(tmp_path, model)
    try:
        assert (await h.run(run_id)).result == {"answer": WHOLE}
        (step,) = model_steps(await h.journal(run_id))
        broken, answered = step.output["attempts"]
        assert broken["error_class"] == "incomplete_answer", broken
        assert broken["cost_usd"] == broken["reserved_usd"] > 0
        assert answered["error_class"] is None
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_an_answer_cut_at_max_tokens_is_never_presented_as_whole(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """``length`` / ``max_tokens`` is the provider's finish, but the text is cut: the step,
    the proposal event and the run's result all say so (the reader of the result sees
    ``finish_reason: length`` next to the cut answer)."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(_not_finished(model, "length" if model == OPENAI else "max_tokens"))
    h, run_id = await run_once(tmp_path, model)
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.COMPLETED
        assert run.result == {"answer": CUT, "finish_reason": "length"}
        (step,) = model_steps(await h.journal(run_id))
        assert step.output["finish_reason"] == "length"
        (proposed,) = [e for e in await h.events(run_id) if e.type == "model.proposed"]
        assert proposed.data["finish_reason"] == "length"
    finally:
        await close(h)


@pytest.mark.parametrize(
    "tail",
    [
        [chunk({}, "stop"), {**BASE, "usage": usage(50, 9)}],
        [chunk({}, "stop"), {**BASE, "choices": None, "usage": usage(50, 9)}],
        [{**BASE, "choices": [{"index": 0, "delta": None, "finish_reason": "stop"}]}],
    ],
    ids=["usage-chunk-without-choices", "choices-null", "finish-with-delta-null"],
)
async def test_a_finished_answer_survives_the_shapes_compatible_servers_send(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: list[Any]
) -> None:
    """A usage chunk with no ``choices`` (or ``null``), a finishing choice with a ``null``
    delta: the answer was finished, so it is the answer, not a failed attempt."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(Reply(sse=[chunk({"content": WHOLE}), *tail]))
    h, run_id = await run_once(tmp_path, OPENAI)
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": WHOLE}, run
        (step,) = model_steps(await h.journal(run_id))
        assert [a["error_class"] for a in step.output["attempts"]] == [None]
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_a_count_far_below_what_the_text_could_be_is_not_a_count(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """300 000 characters of answer reported as 9 tokens (no tokenizer packs 32
    characters in a token on average): the gateway's estimate counts it, so a provider
    cannot make a long answer nearly free."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    monkeypatch.setenv("AGENTLEDGER_MODEL_MAX_TOKENS", "16384")  # room for the text
    text = "Your refund was not approved. " * 10_000
    if model == OPENAI:
        reply = Reply(sse=[chunk({"content": text}), chunk({}, "stop"), chunk(usage=usage(50, 9))])
    else:
        reply = anthropic_events(text, "end_turn")  # message_delta reports 12
    fake.script(reply)
    h, run_id = await run_once(tmp_path, model)
    try:
        (step,) = model_steps(await h.journal(run_id))
        assert step.output["usage"]["source"] == "estimated"
        assert step.output["usage"]["output_tokens"] >= len(text) // 32
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_a_failed_answer_with_a_count_that_cannot_be_its_usage_counts_at_its_reservation(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """A broken-off answer (unknown finish reason) with 3 000 characters of text that
    reports 1 prompt token and 0 output tokens: not its usage, so it is not nearly free;
    it counts at its reservation like an attempt that reported nothing."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    text = "Your refund was " * 200
    if model == OPENAI:
        bad = Reply(sse=[chunk({"content": text}), chunk({}, "error"), chunk(usage=usage(1, 0))])
        whole = openai_stream([WHOLE])
    else:
        bad = anthropic_events(text, "error")
        assert bad.sse is not None
        bad.sse[0] = {"type": "message_start", "message": {**AMSG, "usage": {"input_tokens": 1}}}
        bad.sse[-2]["usage"] = {"output_tokens": 0}
        whole = anthropic_stream([WHOLE])
    fake.script(bad, whole)
    h, run_id = await run_once(tmp_path, model)
    try:
        assert (await h.run(run_id)).result == {"answer": WHOLE}
        (step,) = model_steps(await h.journal(run_id))
        failed = step.output["attempts"][0]
        assert failed["error_class"] == "incomplete_answer"
        assert failed["usage_source"] == "estimated"
        assert failed["cost_usd"] == failed["reserved_usd"] > 0
    finally:
        await close(h)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_a_stream_longer_than_max_tokens_allows_is_not_read_to_its_end(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """A provider that ignores ``max_tokens`` and streams text without end: the gateway
    stops reading once the text is longer than ``max_tokens`` tokens can be (the worker's
    memory is not the provider's to fill until the timeout), and the attempt is an
    unusable answer counted at its reservation."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    monkeypatch.setenv("AGENTLEDGER_MODEL_MAX_TOKENS", "16")
    monkeypatch.setenv("AGENTLEDGER_MODEL_TIMEOUT", "20")
    word = "refund " * 20
    if model == OPENAI:
        endless = Reply(sse=[chunk({"content": CUT})], done=False)
        endless.endless = f"data: {json.dumps(chunk({'content': word}))}\n\n".encode()
    else:
        endless = anthropic_stream([CUT], finished=False)
        delta = {"type": "content_block_delta", "index": 0}
        delta["delta"] = {"type": "text_delta", "text": word}
        endless.endless = f"event: content_block_delta\ndata: {json.dumps(delta)}\n\n".encode()
    fake.script(endless)
    h, run_id = await run_once(tmp_path, model)
    try:
        run = await h.run(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        (step,) = model_steps(await h.journal(run_id))
        (attempt,) = step.output["attempts"]
        assert attempt["error_class"] == "invalid_response", attempt
        assert "max_tokens" in attempt["error"]
        assert attempt["cost_usd"] == attempt["reserved_usd"] > 0
    finally:
        await close(h)


@pytest.mark.parametrize(
    ("prompt", "completion"),
    [(100, 0), ("many", "20x"), (100.5, 20.5), (None, None), (float("nan"), 20), (1e308, 1e308)],
    ids=["zero-output", "strings", "floats", "null", "nan", "1e308"],
)
async def test_usage_that_is_not_a_count_is_estimated_through_the_sdk(
    fake: FakeProviders,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    prompt: Any,
    completion: Any,
) -> None:
    """Counts as strings, fractions, null, NaN or 1e308 in a real usage chunk (the SDK
    passes them on as they are): never taken as counts, never a crash, never a free
    answer. (Integral strings and floats the SDK turns into the integers they are.)"""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(
        Reply(
            sse=[
                chunk({"content": WHOLE}),
                chunk({}, "stop"),
                chunk(usage=usage(prompt, completion)),
            ]
        )
    )
    h, run_id = await run_once(tmp_path, OPENAI)
    try:
        run = await h.run(run_id)
        assert run.result == {"answer": WHOLE}, run
        (step,) = model_steps(await h.journal(run_id))
        assert step.output["usage"]["source"] == "estimated"
        assert (
            step.output["usage"]["output_tokens"] > 0 and step.output["usage"]["input_tokens"] > 0
        )
        assert 0 < step.tokens < step.output["attempts"][0]["reserved_tokens"]
        assert run.cost_usd == pytest.approx(step.cost_usd) and step.cost_usd > 0
    finally:
        await close(h)


async def test_anthropic_usage_in_message_start_and_message_delta_is_counted_once(
    fake: FakeProviders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``message_start`` carries the input (and cache) counts and a placeholder output;
    every ``message_delta`` repeats them cumulatively: each count is taken once, the last."""
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    reply = anthropic_events(WHOLE, "end_turn")
    assert reply.sse is not None
    start_usage = {"input_tokens": 60, "output_tokens": 1, "cache_read_input_tokens": 40}
    reply.sse[0] = {"type": "message_start", "message": {**AMSG, "usage": start_usage}}
    final = reply.sse[-2]
    cumulative = {"input_tokens": 60, "cache_read_input_tokens": 40}
    early = {**final, "delta": {"stop_reason": None}, "usage": {**cumulative, "output_tokens": 5}}
    final["usage"] = {**cumulative, "output_tokens": 12}
    reply.sse.insert(-2, early)
    fake.script(reply)
    h, run_id = await run_once(tmp_path, ANTHROPIC)
    try:
        (step,) = model_steps(await h.journal(run_id))
        assert step.output["usage"] == {
            "input_tokens": 100,
            "output_tokens": 12,
            "cached_tokens": 40,
            "source": "reported",
            "simulated": False,
        }
        assert step.tokens == 112
    finally:
        await close(h)


@pytest.mark.parametrize("reason", ["error", None])
async def test_a_whole_body_is_finished_unless_its_finish_reason_says_otherwise(
    fake: FakeProviders, tmp_path: Path, reason: str | None
) -> None:
    """Not streamed: a complete body with a null finish reason (some compatible servers)
    is the answer; one whose finish reason is ``error`` is not."""
    reply = openai_answer(CUT, usage=(50, 9, 0))
    reply.body["choices"][0]["finish_reason"] = reason
    fake.script(reply, openai_answer(WHOLE))
    h, run_id = await run_once(tmp_path, OPENAI)
    try:
        run = await h.run(run_id)
        (step,) = model_steps(await h.journal(run_id))
        classes = [a["error_class"] for a in step.output["attempts"]]
        if reason is None:
            assert run.result == {"answer": CUT} and classes == [None]
        else:
            assert run.result == {"answer": WHOLE} and classes == ["incomplete_answer", None]
    finally:
        await close(h)
