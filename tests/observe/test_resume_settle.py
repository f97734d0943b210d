"""`runs resume` never calls a write whose outcome is unknown before it is settled, and
never deletes an executed write or compensation (issue 19, points 1-3).

The provider is the external ledger of tests/apps/ledger.py (its own SQLite file): every
call and every effect is a row there, so "money taken" is read from the provider, not
from the run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentledger import App, Status, ToolContext
from agentledger.cli._main import cli
from agentledger.errors import ToolTimeout
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.records import RunStatus, StepStatus
from agentledger.tools._contract import Compensation, RetryPolicy
from tests.apps import ledger
from tests.fast.lifecycle_harness import Harness

FAULT: dict[str, str | None] = {"payout": None, "confirm": None}


async def _ledger_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    found = ledger.status(ctx.idempotency_key)
    return Status.succeeded(found) if found else Status.not_found()


def settle_app() -> App:
    """``payout``: a keyless provider guarded by the effects table, no status check (the
    first call may lose its answer after, or before, the provider applied it);
    ``charge``: a keyed write with a status check, compensated by ``refund``."""
    app = App("settle")

    @app.tool(effect="write", idempotency="effects", timeout=5, retry=RetryPolicy(base_delay=0))
    async def payout(ctx: ToolContext, amount: int) -> dict[str, Any]:
        fault, FAULT["payout"] = FAULT["payout"], None
        if fault == "before_commit":
            ledger.record_call(ctx.idempotency_key, "payout")
            raise ToolTimeout("payout: no answer (the request never reached the ledger)")
        result = ledger.apply(ctx.idempotency_key, "payout", dedupe=False, payload=amount)
        if fault == "after_commit":
            raise ToolTimeout("payout: no answer (the ledger applied it)")
        return result

    @app.tool(effect="write", idempotency="provider", status_check=_ledger_status, timeout=5)
    async def refund(ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
        payload = {"effect_id": effect_id, "amount": amount}
        return ledger.apply(ctx.idempotency_key, "refund", dedupe=True, payload=payload)

    @app.tool(
        effect="money",
        idempotency="provider",
        status_check=_ledger_status,
        timeout=5,
        compensation=Compensation(
            "refund", lambda args, out: {"effect_id": out["effect_id"], "amount": args["amount"]}
        ),
    )
    async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
        return ledger.apply(ctx.idempotency_key, "charge", dedupe=True, payload=amount)

    @app.workflow(name="payout")
    async def payout_run(ctx: Any, input: Any) -> Any:
        paid = await ctx.tool("payout", amount=5000)
        return {"paid": paid["effect_id"], "amount": 5000}

    @app.workflow(name="booking")
    async def booking(ctx: Any, input: Any) -> Any:
        charged = await ctx.tool("charge", amount=120)

        def confirm() -> dict[str, Any]:
            fault, FAULT["confirm"] = FAULT["confirm"], None
            if fault:
                raise RuntimeError("confirm: bug in the confirmation code")
            return {"charge": charged["effect_id"], "amount": 120}

        return await ctx.step("confirm", confirm)

    return app


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    FAULT.update(payout=None, confirm=None)
    return Harness(tmp_path, settle_app(), url=store_url)


def money_taken(kind: str, refunds: str | None = None) -> int:
    """Net money the provider's ledger shows taken by ``kind`` effects."""
    taken = sum(int(e["payload"]) for e in ledger.effects(kind=kind))
    if refunds:
        taken -= sum(int(e["payload"]["amount"]) for e in ledger.effects(kind=refunds))
    return taken


async def _unknown_payout(h: Harness, fault: str) -> tuple[str, str]:
    """A payout run in ``needs_human`` whose payout's outcome is unknown; its key."""
    FAULT["payout"] = fault
    run_id = await h.submit("payout")
    run = await h.drive(run_id)
    assert run.status == RunStatus.NEEDS_HUMAN, run
    (step,) = await h.journal(run_id)
    assert step.status == StepStatus.UNKNOWN and step.idempotency_key
    return run_id, step.idempotency_key


@pytest.mark.parametrize("from_step", [None, 1])
async def test_resume_refuses_an_unknown_write_until_it_is_settled(
    harness: Harness, from_step: int | None
) -> None:
    async with harness as h:
        run_id, key = await _unknown_payout(h, "after_commit")
        assert money_taken("payout") == 5000
        with pytest.raises(ResumeRefused) as refused:
            await h.store.transact(
                observe_resume.resume_run, run_id, from_step, "ops:alice", "fixed"
            )
        message = str(refused.value)
        assert "step 1" in message and key in message
        assert f"agentledger runs settle {run_id} 1 --applied" in message
        assert (await h.run(run_id)).status == RunStatus.NEEDS_HUMAN  # untouched
        assert [s.status for s in await h.journal(run_id)] == [StepStatus.UNKNOWN]
        assert ledger.count_calls(kind="payout") == 1

        # The operator looked at the provider: it was paid (effect 1).
        paid = ledger.effects(kind="payout")[0]
        await h.store.transact(
            observe_resume.settle_step, run_id, 1, True, paid, "ops:alice", "seen in the ledger"
        )
        (step,) = await h.journal(run_id)
        assert step.status == StepStatus.SUCCEEDED and step.output == paid
        settled = [e for e in await h.events(run_id) if e.type == "step.settled"]
        assert len(settled) == 1 and settled[0].actor == "ops:alice"
        assert settled[0].data["applied"] is True
        assert settled[0].data["reason"] == "seen in the ledger"

        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:alice", "settled")
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert ledger.count_calls(kind="payout") == 1  # never called again
        assert money_taken("payout") == run.result["amount"] == 5000
        assert run.result["paid"] == paid["effect_id"]


async def test_not_applied_is_sent_again_with_the_same_key(harness: Harness) -> None:
    async with harness as h:
        run_id, key = await _unknown_payout(h, "before_commit")
        assert money_taken("payout") == 0
        with pytest.raises(ResumeRefused, match="outcome is unknown"):
            await h.store.transact(observe_resume.resume_run, run_id, None, "ops:bob", None)
        await h.store.transact(
            observe_resume.settle_step, run_id, 1, False, None, "ops:bob", "not in the ledger"
        )
        (step,) = await h.journal(run_id)
        assert step.status == StepStatus.RETRYING and step.input["settled"]["by"] == "ops:bob"
        # The same decision again (a retry after a lost reply) is a no-op; another one
        # is refused: the step is no longer unknown.
        await h.store.transact(
            observe_resume.settle_step, run_id, 1, False, None, "ops:bob", "not in the ledger"
        )
        with pytest.raises(ResumeRefused, match="not in flight"):
            await h.store.transact(
                observe_resume.settle_step, run_id, 1, True, {}, "ops:bob", "again"
            )
        assert len([e for e in await h.events(run_id) if e.type == "step.settled"]) == 1
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:bob", "settled")
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert [c[0] for c in ledger.calls(kind="payout")] == [key, key]
        assert money_taken("payout") == run.result["amount"] == 5000
        with pytest.raises(ResumeRefused, match="completed"):
            await h.store.transact(
                observe_resume.settle_step, run_id, 1, True, {}, "ops:bob", "again"
            )


async def test_settle_refuses_what_it_cannot_settle(harness: Harness) -> None:
    async with harness as h:
        run_id, _ = await _unknown_payout(h, "after_commit")
        with pytest.raises(ResumeRefused, match="no step 7"):
            await h.store.transact(
                observe_resume.settle_step, run_id, 7, True, {}, "ops:bob", "why"
            )
        with pytest.raises(ResumeRefused, match="no run"):
            await h.store.transact(
                observe_resume.settle_step, "nope", 1, True, {}, "ops:bob", "why"
            )
        with pytest.raises(ResumeRefused, match="reason"):
            await h.store.transact(observe_resume.settle_step, run_id, 1, True, {}, "ops:bob", " ")
        assert [s.status for s in await h.journal(run_id)] == [StepStatus.UNKNOWN]


@pytest.mark.parametrize("from_step", [None, 1, 2, 3, 4, 5])
async def test_a_compensated_run_is_never_completed_on_a_refunded_charge(
    harness: Harness, from_step: int | None
) -> None:
    """Every resume mode: refused with the journal untouched, or completed with the
    provider's ledger and the run's result agreeing on the money taken."""
    async with harness as h:
        FAULT["confirm"] = "bug"
        run_id = await h.submit("booking")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        before = [(s.step_no, s.kind, s.status) for s in await h.journal(run_id)]
        assert [k for _, k, _ in before] == ["tool", "step", "decision", "compensation"]
        assert money_taken("charge", "refund") == 0  # charged, then refunded
        plan = await h.store.read(observe_resume.plan_resume, run_id, from_step)
        # Every effect in the resumed range is in the plan with its status and key.
        listed = {e["step_no"]: e for e in plan.effects}
        if from_step in (None, 1, 2, 3, 4):
            assert listed[4]["state"] == "executed" and listed[4]["key"]
            # Refused unless forced: re-executing the refund is a confirmed effect.
            assert plan.refused or plan.needs_force
        try:
            await h.store.transact(
                observe_resume.resume_run, run_id, from_step, "ops:carol", "bug fixed"
            )
        except ResumeRefused as exc:
            assert "compensated" in str(exc) and "submit" in str(exc)
            # Nothing was deleted: the charge and its refund are still in the journal.
            after = [(s.step_no, s.kind, s.status) for s in await h.journal(run_id)]
            assert after == before
            assert (await h.run(run_id)).status == RunStatus.FAILED
            return
        run = await h.drive(run_id)
        taken = run.result["amount"] if run.status == RunStatus.COMPLETED else 0
        assert money_taken("charge", "refund") == taken, run
        assert [s.status for s in await h.journal(run_id)][:4] == [b[2] for b in before]


def test_cli_settle_and_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    FAULT.update(payout=None, confirm=None)
    h = Harness(tmp_path, settle_app())

    async def seed() -> tuple[str, str]:
        async with h:
            return await _unknown_payout(h, "after_commit")

    run_id, key = asyncio.run(seed())
    db = f"sqlite:///{h.path}"
    runner = CliRunner()
    out = runner.invoke(
        cli, ["runs", "resume", run_id, "--from-step", "1", "--dry-run", "--db", db]
    )
    assert out.exit_code == 0, out.output
    assert f"1 payout: UNKNOWN outcome, key {key}" in out.output
    out = runner.invoke(cli, ["runs", "resume", run_id, "--db", db])
    assert out.exit_code == 1 and f"agentledger runs settle {run_id} 1" in out.output
    args = ["runs", "settle", run_id, "1", "--applied", "--db", db]

    def said(out: Any) -> str:
        return f"{out.output} {out.exception}"

    out = runner.invoke(cli, args)
    assert out.exit_code != 0 and "--reason" in said(out)
    out = runner.invoke(cli, [*args, "--reason", "seen"])
    assert out.exit_code != 0 and "--result" in said(out)
    out = runner.invoke(cli, [*args, "--reason", "seen", "--result", "[1"])
    assert out.exit_code != 0 and "--result" in said(out)
    out = runner.invoke(cli, [*args, "--not-applied", "--reason", "seen"])
    assert out.exit_code != 0 and "one of" in said(out)
    out = runner.invoke(cli, ["runs", "settle", run_id, "9", "--not-applied", "--reason", "x",
                              "--db", db])  # fmt: skip
    assert out.exit_code != 0 and "no step 9" in said(out)
    out = runner.invoke(cli, ["runs", "resume", run_id, "--force", "--reason", "x", "--db", db])
    # A force lifts only the refusal of re-executing confirmed effects: an unknown write
    # without a status check is settled first, forced or not.
    assert out.exit_code != 0 and f"agentledger runs settle {run_id} 1" in said(out)
    out = runner.invoke(cli, [*args, "--reason", "seen", "--result", '{"effect_id": 1}'])
    assert out.exit_code == 0, out.output
    assert "settled" in out.output and "applied" in out.output
    out = runner.invoke(cli, ["runs", "resume", run_id, "--dry-run", "--db", db])
    assert out.exit_code == 0 and "UNKNOWN" not in out.output, out.output
