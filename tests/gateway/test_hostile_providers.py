"""A hostile or broken provider, over loopback HTTP through the real SDKs: finish reasons
the gateway must not take for a whole answer, usage that must not be double-counted or
dodged, streams that never end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gateway.fakes import FakeProviders, Reply, anthropic_stream, openai_stream
from tests.gateway.test_gateway import close, model_steps, run_once

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
