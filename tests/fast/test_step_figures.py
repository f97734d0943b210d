"""A step's figures say what they mean: an approved call's duration is the call's own
and the wait for the decision is shown apart; an outbox step shows its deliveries; a
workflow step that raised was called once; an operator's resume is counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentledger import App, RunStatus, WorkflowContext
from agentledger._outbox import OutboxDispatcher
from agentledger.cli._tables import attempts_text, journal_entry, journal_notes
from tests.fast.lifecycle_harness import Harness
from tests.fast.test_approvals_gate import make_app as gate_app


async def test_an_approved_call_lasts_the_call_and_its_wait_is_shown_apart(
    store_url: str, tmp_path: Path
) -> None:
    calls: list[str] = []
    async with Harness(tmp_path, gate_app(calls), store_url) as h:
        run_id = await h.submit("book_it")
        assert await h.execute(run_id) == RunStatus.WAITING
        (approval,) = await h.store.get_approvals(run_id)
        h.clock.advance(3600)  # the guest decides an hour later
        await h.store.decide_approval(approval.id, "approve", "guest:ann", h.clock)
        run = await h.drive(run_id)
        (step,) = await h.journal(run_id)
        notes = await journal_notes(h.store, run_id)
        (decided,) = await h.store.get_approvals(run_id)
    assert run.status == RunStatus.COMPLETED and calls == ["book:h1"]
    assert step.duration_ms is not None and step.duration_ms < 1000, step  # the call only
    # The wait is the approval's: requested (the worker's clock) to decided (the store's).
    assert decided.decided_at is not None
    waited = round(decided.decided_at - decided.requested_at, 3)
    assert waited >= 3600 and notes[step.step_no]["waited_s"] == waited
    entry = journal_entry(step, notes)
    assert entry["waited_s"] == waited and entry["duration_ms"] == step.duration_ms


async def test_a_rejected_call_lasts_nothing_and_its_wait_is_shown_apart(
    store_url: str, tmp_path: Path
) -> None:
    async with Harness(tmp_path, gate_app([]), store_url) as h:
        run_id = await h.submit("book_it")
        await h.execute(run_id)
        (approval,) = await h.store.get_approvals(run_id)
        h.clock.advance(600)
        await h.store.decide_approval(approval.id, "reject", "guest:ann", h.clock)
        await h.drive(run_id)
        (step,) = await h.journal(run_id)
        notes = await journal_notes(h.store, run_id)
    assert step.status == "failed" and step.duration_ms is not None and step.duration_ms < 1000
    assert notes[step.step_no]["waited_s"] >= 600


def _app() -> App:
    app = App("figures")

    @app.tool(effect="notify", delivery="outbox", timeout=5)
    async def note(ctx: Any, msg: str) -> dict[str, Any]:
        return {"sent": msg}

    def explode() -> None:
        raise ValueError("no")

    @app.workflow(name="tell", version="1")
    async def tell(ctx: WorkflowContext, input: Any) -> Any:
        return await ctx.tool("note", msg="hi")

    @app.workflow(name="boom", version="1")
    async def boom(ctx: WorkflowContext, input: Any) -> Any:
        return await ctx.step("explode", explode)

    return app


async def test_an_outbox_step_shows_its_deliveries(store_url: str, tmp_path: Path) -> None:
    app = _app()
    async with Harness(tmp_path, app, store_url) as h:
        run_id = await h.submit("tell")
        await h.drive(run_id)
        before = await journal_notes(h.store, run_id)
        await OutboxDispatcher(h.store, app, "test", base_delay=0).drain()
        after = await journal_notes(h.store, run_id)
    assert before[1]["delivery"] == {"status": "pending", "attempts": 0}
    assert after[1]["delivery"] == {"status": "delivered", "attempts": 1}


async def test_a_workflow_step_that_raised_was_called_once(store_url: str, tmp_path: Path) -> None:
    async with Harness(tmp_path, _app(), store_url) as h:
        run = await h.drive(await h.submit("boom"))
        (step,) = await h.journal(run.id)
    assert run.status == RunStatus.FAILED
    assert (step.status, step.attempts) == ("failed", 1)


async def test_a_step_that_called_nothing_shows_no_attempts(tmp_path: Path) -> None:
    async with Harness(tmp_path, gate_app([])) as h:
        run = await h.drive(await h.submit("wire_it"))  # denied by the policy: never called
        (step,) = await h.journal(run.id)
    assert (step.status, step.attempts) == ("failed", 0)
    assert attempts_text(journal_entry(step)) == "-"
