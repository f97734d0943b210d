"""Replay equivalence: what a step returns on its first pass is what a replay returns;
keys and input hashes are fixed by the first journal entry (issue items 1, 16, 24)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from agentledger import App, RunStatus, Status, ToolContext
from agentledger._canonical import NotJournalable
from agentledger.engine._workflow_runner import StepFailed
from agentledger.errors import InvalidArguments
from tests.fast.lifecycle_harness import KILLED, Harness, Killed


def _sleepy_app(seen: list[Any], *, sleep: bool) -> App:
    app = App("replay")

    @app.workflow(name="int_keys")
    async def int_keys(ctx: Any, input: Any) -> Any:
        value = await ctx.step("load", lambda: {1: "x"})
        if sleep:
            await ctx.sleep(0.3)
        return value[1]

    @app.workflow(name="tuples")
    async def tuples(ctx: Any, input: Any) -> Any:
        value = await ctx.step("load", lambda: {"pair": (1, 2), "text": "a\x00b"})
        seen.append(value)
        if sleep:
            await ctx.sleep(0.3)
        return value

    @app.workflow(name="caught")
    async def caught(ctx: Any, input: Any) -> Any:
        def bad() -> None:
            raise ValueError("no such hotel")

        try:
            await ctx.step("bad", bad)
        except StepFailed as exc:
            seen.append((type(exc).__name__, exc.failure, str(exc), type(exc.__cause__).__name__))
        if sleep:
            await ctx.sleep(0.3)
        return "handled"

    @app.workflow(name="stamp")
    async def stamp(ctx: Any, input: Any) -> Any:
        return await ctx.step("now", lambda: datetime.datetime(2026, 1, 1))

    return app


async def test_a_short_sleep_does_not_change_how_a_run_ends(tmp_path: Path) -> None:
    """Item 16: a 0.3 s sleep forces a replay; the run must end the same either way."""
    ends = []
    for sleep in (False, True):
        async with Harness(tmp_path / str(sleep), _sleepy_app([], sleep=sleep)) as h:
            run = await h.drive(await h.submit("int_keys"))
            (step, *_) = await h.journal(run.id)
            ends.append((run.status, step.status, step.error_class))
    assert ends[0] == ends[1] == (RunStatus.FAILED, "failed", "not_journalable")


async def test_first_pass_returns_the_journal_round_trip(tmp_path: Path) -> None:
    seen: list[Any] = []
    async with Harness(tmp_path, _sleepy_app(seen, sleep=True)) as h:
        run = await h.drive(await h.submit("tuples"))
    assert run.status == RunStatus.COMPLETED
    assert len(seen) == 2 and seen[0] == seen[1] == {"pair": [1, 2], "text": "a\ufffdb"}
    assert run.result == seen[0]


async def test_a_failed_step_raises_the_same_type_on_first_pass_and_replay(tmp_path: Path) -> None:
    seen: list[Any] = []
    async with Harness(tmp_path, _sleepy_app(seen, sleep=True)) as h:
        run = await h.drive(await h.submit("caught"))
    assert run.status == RunStatus.COMPLETED, run
    first, replay = seen
    assert first == ("StepFailed", "ValueError", "no such hotel", "ValueError")
    assert replay[:3] == first[:3]


async def test_a_datetime_result_fails_the_step_with_a_class(tmp_path: Path) -> None:
    async with Harness(tmp_path, _sleepy_app([], sleep=False)) as h:
        run = await h.drive(await h.submit("stamp"))
        (step,) = await h.journal(run.id)
    assert run.status == RunStatus.FAILED
    assert (step.status, step.error_class) == ("failed", "not_journalable")
    assert "isoformat" in (step.error or "")


def _tool_app(provider: dict[str, Any], caught: list[Any]) -> App:
    app = App("keys")

    async def status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        provider.setdefault("checked", []).append(ctx.idempotency_key)
        done = provider.get(ctx.idempotency_key)
        return Status.succeeded(done) if done else Status.not_found()

    @app.tool(effect="money", idempotency="provider", status_check=status)
    async def charge(ctx: ToolContext, amount: int, tags: list[str]) -> dict[str, Any]:
        provider.setdefault("calls", []).append(ctx.idempotency_key)
        provider[ctx.idempotency_key] = {"charged": amount}
        if provider.pop("kill", False):
            raise Killed()
        return {"charged": amount}

    @app.tool(effect="read")
    async def deep(ctx: ToolContext) -> Any:
        value: Any = "leaf"
        for _ in range(5000):
            value = [value]
        return value

    @app.workflow(name="pay")
    async def pay(ctx: Any, input: Any) -> Any:
        return await ctx.tool("charge", amount=input["amount"], tags=input["tags"])

    @app.workflow(name="pay_with_set")
    async def pay_with_set(ctx: Any, input: Any) -> Any:
        try:
            await ctx.tool("charge", amount=5, tags={"b", "a"})
        except InvalidArguments as exc:
            caught.append(str(exc))
        return "refused"

    @app.workflow(name="deep")
    async def deep_flow(ctx: Any, input: Any) -> Any:
        try:
            return await ctx.tool("deep")
        except NotJournalable as exc:
            caught.append(exc.error_class)
            raise

    return app


async def test_a_resumed_write_keeps_its_journaled_key(tmp_path: Path) -> None:
    """Item 1: the key is fixed when first journaled; resume never recomputes it."""
    provider: dict[str, Any] = {"kill": True}
    async with Harness(tmp_path, _tool_app(provider, [])) as h:
        run_id = await h.submit("pay", {"amount": 40, "tags": ["x"]})
        assert await h.execute(run_id) == KILLED
        (started,) = await h.journal(run_id)
        assert started.status == "started" and started.idempotency_key == provider["calls"][0]
        # A run journaled by another version of the code carries a key in another format.
        provider["legacy-key"] = provider.pop(started.idempotency_key)
        h.set_key(run_id, 1, "legacy-key")
        run = await h.drive(run_id)
        (step,) = await h.journal(run_id)
    assert run.status == RunStatus.COMPLETED
    assert step.idempotency_key == "legacy-key"
    assert provider["checked"] == ["legacy-key"]  # the provider was asked about the first key
    assert len(provider["calls"]) == 1  # and never charged again


async def test_workflow_tool_arguments_must_be_json(tmp_path: Path) -> None:
    """Item 1: a set (whose str() differs by hash seed) is refused, never hashed."""
    provider: dict[str, Any] = {}
    caught: list[Any] = []
    async with Harness(tmp_path, _tool_app(provider, caught)) as h:
        run = await h.drive(await h.submit("pay_with_set"))
        (step,) = await h.journal(run.id)
    assert run.status == RunStatus.COMPLETED
    assert "calls" not in provider
    assert (step.status, step.error_class) == ("failed", "invalid_arguments")
    assert caught and "not JSON" in caught[0]


async def test_workflow_tool_key_is_stable_and_hashes_canonical_json(tmp_path: Path) -> None:
    provider: dict[str, Any] = {}
    async with Harness(tmp_path, _tool_app(provider, [])) as h:
        a = await h.drive(await h.submit("pay", {"amount": 1, "tags": ["x"]}))
        (step,) = await h.journal(a.id)
    from agentledger._canonical import input_hash

    digest = input_hash({"amount": 1, "tags": ["x"]})
    assert step.idempotency_key == f"{a.id}:1:charge:{digest}"
    assert step.input_hash == digest


async def test_a_tool_result_nested_5000_deep_fails_the_step(tmp_path: Path) -> None:
    caught: list[Any] = []
    async with Harness(tmp_path, _tool_app({}, caught)) as h:
        run = await h.drive(await h.submit("deep"), passes=2)
        (step,) = await h.journal(run.id)
    assert run.status == RunStatus.FAILED and run.resumes == 0
    assert (step.status, step.error_class) == ("failed", "not_journalable")
    assert caught == ["not_journalable"]


CHOICE = {"hotel": "h1"}


def _changing_app() -> App:
    app = App("nondet")

    @app.workflow(name="book")
    async def book(ctx: Any, input: Any) -> Any:
        await ctx.step("pick", lambda hotel: {"hotel": hotel}, CHOICE["hotel"])
        await ctx.sleep(5)
        return "done"

    return app


async def test_same_step_with_other_arguments_is_nondeterminism(tmp_path: Path) -> None:
    """Item 24: the input hash is journaled and compared on replay."""
    async with Harness(tmp_path, _changing_app()) as h:
        run_id = await h.submit("book")
        assert await h.execute(run_id) == RunStatus.WAITING
        (pick, _) = await h.journal(run_id)
        assert pick.input_hash is not None
        CHOICE["hotel"] = "h2"  # a deploy changed the code under the run
        try:
            run = await h.drive(run_id)
        finally:
            CHOICE["hotel"] = "h1"
        events = [e for e in await h.events(run_id) if e.type == "run.handover"]
    assert run.status == RunStatus.NEEDS_HUMAN
    assert "step 1" in (run.handover_reason or "") and "'pick'" in (run.handover_reason or "")
    assert events and events[-1].data["reason"] == "nondeterminism"


async def test_same_step_with_same_arguments_replays(tmp_path: Path) -> None:
    async with Harness(tmp_path, _changing_app()) as h:
        run = await h.drive(await h.submit("book"))
    assert run.status == RunStatus.COMPLETED
