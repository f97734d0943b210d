"""Attacks on `runs resume` / `runs settle`: an operator who aims --from-step past an
unknown write, settles the same write twice, or hands hostile values; the dry run must
name every effect the resumed run calls again (issue 19, points 1-3).

The provider is the external ledger of tests/apps/ledger.py: every call is a row there.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentledger import App, ToolContext, open_store
from agentledger.errors import ToolTimeout
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.records import RunStatus, StepStatus
from agentledger.tools._contract import Compensation, RetryPolicy
from tests.apps import ledger
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_resume_settle import FAULT, money_taken, settle_app

TRANSFER_FAULTS: list[str] = []


def attack_app() -> App:
    """settle_app plus ``transfer``: a provider that dedupes keys but has no status
    check (a lost answer is an unknown outcome the engine would resend blind-keyed)."""
    app = settle_app()

    @app.tool(effect="write", idempotency="provider", timeout=5)
    async def transfer(ctx: ToolContext, amount: int) -> dict[str, Any]:
        result = ledger.apply(ctx.idempotency_key, "transfer", dedupe=True, payload=amount)
        if TRANSFER_FAULTS:
            TRANSFER_FAULTS.pop(0)
            raise ToolTimeout("transfer: no answer (the ledger applied it)")
        return result

    @app.tool(
        effect="money",
        idempotency="effects",
        timeout=5,
        retry=RetryPolicy(base_delay=0),
        compensation=Compensation(
            "refund", lambda args, out: {"effect_id": out["effect_id"], "amount": args["amount"]}
        ),
    )
    async def grant(ctx: ToolContext, amount: int) -> dict[str, Any]:
        result = ledger.apply(ctx.idempotency_key, "grant", dedupe=False, payload=amount)
        if FAULT.get("grant"):
            FAULT["grant"] = None
            raise ToolTimeout("grant: no answer (the ledger applied it)")
        return result

    @app.workflow(name="granted")
    async def granted(ctx: Any, input: Any) -> Any:
        given = await ctx.tool("grant", amount=300)

        def confirm() -> dict[str, Any]:
            fault, FAULT["confirm"] = FAULT["confirm"], None
            if fault:
                raise RuntimeError("confirm: bug in the confirmation code")
            return {"grant": given["effect_id"], "amount": 300}

        return await ctx.step("confirm", confirm)

    @app.workflow(name="prepped")
    async def prepped(ctx: Any, input: Any) -> Any:
        def prep() -> str:
            fault, FAULT["prep"] = FAULT.get("prep"), None
            if fault:
                raise RuntimeError("prep: bug")
            return "ready"

        await ctx.step("prep", prep)
        charged = await ctx.tool("charge", amount=120)

        def confirm() -> dict[str, Any]:
            fault, FAULT["confirm"] = FAULT["confirm"], None
            if fault:
                raise RuntimeError("confirm: bug in the confirmation code")
            return {"charge": charged["effect_id"], "amount": 120}

        return await ctx.step("confirm", confirm)

    @app.workflow(name="transfer")
    async def transfer_run(ctx: Any, input: Any) -> Any:
        sent = await ctx.tool("transfer", amount=70)
        return {"sent": sent["effect_id"], "amount": 70}

    return app


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    FAULT.update(payout=None, confirm=None, prep=None, grant=None)
    TRANSFER_FAULTS.clear()
    return Harness(tmp_path, attack_app(), url=store_url)


async def _unknown(h: Harness, name: str) -> str:
    run_id = await h.submit(name)
    run = await h.drive(run_id)
    assert run.status == RunStatus.NEEDS_HUMAN, run
    assert [s.status for s in await h.journal(run_id)] == [StepStatus.UNKNOWN]
    return run_id


@pytest.mark.parametrize("from_step", [2, 3, 1000])
async def test_from_step_past_an_unknown_write_is_refused_and_listed(
    harness: Harness, from_step: int
) -> None:
    """--from-step beyond an unknown write keeps it in the journal, where the engine
    would call it again: the resume is judged on it all the same."""
    async with harness as h:
        TRANSFER_FAULTS.extend(["after_commit"] * 50)  # every same-key resend loses its answer
        run_id = await _unknown(h, "transfer")
        calls = ledger.count_calls(kind="transfer")
        plan = await h.store.read(observe_resume.plan_resume, run_id, from_step)
        assert [e["step_no"] for e in plan.effects] == [1], plan
        assert plan.effects[0]["state"] == "unknown" and plan.refused
        with pytest.raises(ResumeRefused, match="runs settle"):
            await h.store.transact(
                observe_resume.resume_run, run_id, from_step, "ops:eve", "skip it"
            )
        assert (await h.run(run_id)).status == RunStatus.NEEDS_HUMAN
        assert ledger.count_calls(kind="transfer") == calls


async def test_a_second_settle_of_a_step_unknown_again_is_recorded(harness: Harness) -> None:
    """Settled "not applied", sent again, unknown again: the same words again settle it
    again (they are not taken for a retry of the first decision)."""
    async with harness as h:
        FAULT["payout"] = "before_commit"
        run_id = await _unknown(h, "payout")
        await h.store.transact(
            observe_resume.settle_step, run_id, 1, False, None, "ops:bob", "not in the ledger"
        )
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:bob", "settled")
        FAULT["payout"] = "before_commit"
        run = await h.drive(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        assert [s.status for s in await h.journal(run_id)] == [StepStatus.UNKNOWN]
        step = await h.store.transact(
            observe_resume.settle_step, run_id, 1, False, None, "ops:bob", "not in the ledger"
        )
        assert step.status == StepStatus.RETRYING
        assert [s.status for s in await h.journal(run_id)] == [StepStatus.RETRYING]
        settled = [e for e in await h.events(run_id) if e.type == "step.settled"]
        assert len(settled) == 2
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:bob", "settled again")
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert ledger.count_calls(kind="payout") == 3
        assert len(ledger.effects(kind="payout")) == 1 and run.result["amount"] == 5000


@pytest.mark.parametrize("huge", [2**31, 2**63, 10**30])
async def test_a_huge_step_number_is_refused_with_a_clear_message(
    harness: Harness, huge: int
) -> None:
    async with harness as h:
        FAULT["payout"] = "after_commit"
        run_id = await _unknown(h, "payout")
        with pytest.raises(ResumeRefused, match=f"has no step {huge}"):
            await h.store.transact(
                observe_resume.settle_step, run_id, huge, False, None, "ops:eve", "why"
            )
        with pytest.raises(ResumeRefused, match="--from-step must be"):
            await h.store.read(observe_resume.plan_resume, run_id, huge)
        with pytest.raises(ResumeRefused, match="--from-step must be"):
            await h.store.transact(observe_resume.resume_run, run_id, huge, "ops:eve", "why")
        assert [s.status for s in await h.journal(run_id)] == [StepStatus.UNKNOWN]


def _waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


async def test_a_resume_paused_after_reading_the_journal_never_deletes_what_ran_since(
    harness: Harness, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resume A reads the journal, then pauses (a slow operator's connection); meanwhile
    resume B goes through, a worker charges, fails and refunds, and the run is failed
    again. A must judge the journal as it is when it moves the run, not as it read it:
    it may never delete the charge and its refund."""
    if backend != "postgres":
        pytest.skip("SQLite's BEGIN IMMEDIATE takes the write lock before the first read")
    read, go = threading.Event(), threading.Event()
    original = observe_resume.plan_resume

    def paused(*args: Any) -> Any:
        plan = original(*args)
        if not read.is_set():  # resume A only: the first to read
            read.set()
            go.wait()
        return plan

    monkeypatch.setattr(observe_resume, "plan_resume", paused)
    async with harness as h:
        FAULT["prep"] = "bug"
        run_id = await h.submit("prepped")
        assert (await h.drive(run_id)).status == RunStatus.FAILED
        other = open_store(h.url)
        await other.open()
        try:
            first = asyncio.ensure_future(
                other.transact(observe_resume.resume_run, run_id, None, "ops:a", "fixed")
            )
            while not read.is_set():
                await asyncio.sleep(0.01)

            async def second() -> None:
                try:
                    await h.store.transact(
                        observe_resume.resume_run, run_id, None, "ops:b", "fixed"
                    )
                except ResumeRefused:
                    return  # A holds the run: B is refused once A moved it
                FAULT["confirm"] = "bug"
                assert (await h.drive(run_id)).status == RunStatus.FAILED

            b = asyncio.ensure_future(second())
            while not (b.done() or _waiting_on_a_lock(h.url)):
                await asyncio.sleep(0.01)
            reader = open_store(h.url)  # the two others may both be waiting
            await reader.open()
            try:
                executed = {
                    s.idempotency_key
                    for s in await reader.load_journal(run_id)
                    if observe_resume.effect_state(s) == "executed"
                }
            finally:
                await reader.close()
            go.set()
            with contextlib.suppress(ResumeRefused):  # B may have moved the run first
                await first
            await b
        finally:
            go.set()
            await other.close()
        kept = {s.idempotency_key for s in await h.journal(run_id)}
        assert executed <= kept, "an executed write or compensation was deleted"
        run = await h.run(run_id)
        if not run.terminal:
            run = await h.drive(run_id)
        taken = run.result["amount"] if run.status == RunStatus.COMPLETED else 0
        assert money_taken("charge", "refund") == taken, run


@pytest.mark.parametrize("later", ["completes", "fails"])
async def test_a_result_settled_applied_is_what_later_steps_and_the_compensation_use(
    harness: Harness, later: str
) -> None:
    async with harness as h:
        FAULT["grant"] = "after_commit"
        run_id = await _unknown(h, "granted")
        seen = ledger.effects(kind="grant")[0]
        await h.store.transact(
            observe_resume.settle_step, run_id, 1, True, seen, "ops:amy", "in the ledger"
        )
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "settled")
        FAULT["confirm"] = "bug" if later == "fails" else None
        run = await h.drive(run_id)
        assert ledger.count_calls(kind="grant") == 1
        refunded = [r["payload"]["effect_id"] for r in ledger.effects(kind="refund")]
        if later == "completes":
            assert run.status == RunStatus.COMPLETED, run
            assert run.result == {"grant": seen["effect_id"], "amount": 300}
            assert refunded == []
        else:  # the refund is built from the settled result
            assert run.status == RunStatus.FAILED, run
            assert refunded == [seen["effect_id"]]
        taken = run.result["amount"] if run.status == RunStatus.COMPLETED else 0
        assert money_taken("grant", "refund") == taken


async def test_two_opposite_settles_at_once_one_wins(harness: Harness) -> None:
    async with harness as h:
        FAULT["payout"] = "after_commit"
        run_id = await _unknown(h, "payout")
        paid = ledger.effects(kind="payout")[0]
        other = open_store(h.url)
        await other.open()
        try:
            outcomes = await asyncio.gather(
                h.store.transact(
                    observe_resume.settle_step, run_id, 1, True, paid, "ops:amy", "in the ledger"
                ),
                other.transact(
                    observe_resume.settle_step,
                    run_id,
                    1,
                    False,
                    None,
                    "ops:bob",
                    "not in the ledger",
                ),
                return_exceptions=True,
            )
        finally:
            await other.close()
        refused = [o for o in outcomes if isinstance(o, ResumeRefused)]
        assert len(refused) == 1, outcomes
        settled = [e for e in await h.events(run_id) if e.type == "step.settled"]
        (step,) = await h.journal(run_id)
        assert len(settled) == 1
        assert step.input["settled"]["applied"] is settled[0].data["applied"]
        assert step.status == (StepStatus.SUCCEEDED if settled[0].data["applied"] else "retrying")


async def test_the_dry_run_names_exactly_the_keys_the_resumed_run_sends(harness: Harness) -> None:
    """Settled "not applied": the dry run says which key is sent again; the provider
    then sees exactly that key, once, and nothing else."""
    async with harness as h:
        TRANSFER_FAULTS.extend(["after_commit"] * 50)
        run_id = await _unknown(h, "transfer")
        TRANSFER_FAULTS.clear()
        await h.store.transact(
            observe_resume.settle_step, run_id, 1, False, None, "ops:bob", "not in the ledger"
        )
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        resent = [e["key"] for e in plan.effects if e["action"].startswith("sent again")]
        before = len(ledger.calls())
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:bob", "settled")
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert [c[0] for c in ledger.calls()[before:]] == resent != []
        assert money_taken("transfer") == run.result["amount"]
