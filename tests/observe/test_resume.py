"""`runs resume` continues a failed run from its failed step after a fix; a confirmed
payment is never executed again without --force and a reason (issue 11, item 5)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentledger.cli._main import cli
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.records import RunStatus, StepStatus
from tests.fast.lifecycle_harness import Harness
from tests.observe.apps import BUG_FLAG, Payments, booking_app


async def _failed_run(h: Harness, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(BUG_FLAG, "1")
    run_id = await h.submit("booking")
    run = await h.drive(run_id)
    assert run.status == RunStatus.FAILED, run
    steps = {s.step_no: s for s in await h.journal(run_id)}
    assert steps[2].status == StepStatus.SUCCEEDED and steps[3].status == StepStatus.FAILED
    return run_id


async def test_resume_after_a_fix_continues_from_the_failed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payments = Payments()
    async with Harness(tmp_path, booking_app(payments)) as h:
        run_id = await _failed_run(h, monkeypatch)
        assert len(payments.calls) == 1
        monkeypatch.delenv(BUG_FLAG)  # the fix is deployed (same version)
        plan = await h.store.transact(
            observe_resume.resume_run, run_id, None, "ops:alice", "confirm bug fixed"
        )
        assert plan.from_step == 3 and not plan.confirmed
        assert (await h.run(run_id)).status == RunStatus.QUEUED
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert run.result == {"confirmed": "Paris-1", "charge": "ch_1"}
        assert len(payments.calls) == 1  # the payment was replayed, not executed again
        resumed = [e for e in await h.events(run_id) if e.type == "run.resumed"]
        assert len(resumed) == 1 and resumed[0].actor == "ops:alice"
        assert resumed[0].data["from_step"] == 3 and resumed[0].data["effects"] == []
        assert [s["name"] for s in resumed[0].data["archived_steps"]] == ["confirm"]
        # A completed run is not resumed again.
        with pytest.raises(ResumeRefused):
            await h.store.transact(observe_resume.resume_run, run_id, None, "ops:alice")


async def test_a_confirmed_payment_is_never_executed_again_nor_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payments = Payments()
    async with Harness(tmp_path, booking_app(payments)) as h:
        run_id = await _failed_run(h, monkeypatch)
        monkeypatch.delenv(BUG_FLAG)
        with pytest.raises(ResumeRefused, match=r"was executed.*--from-step 3"):
            await h.store.transact(
                observe_resume.resume_run, run_id, 2, "ops:alice", "provider refunded"
            )
        assert (await h.run(run_id)).status == RunStatus.FAILED  # untouched
        assert len(await h.journal(run_id)) == 3
        assert len(payments.calls) == 1


async def test_a_forced_resume_re_executes_a_confirmed_payment_and_says_who_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payments = Payments()
    async with Harness(tmp_path, booking_app(payments)) as h:
        run_id = await _failed_run(h, monkeypatch)
        monkeypatch.delenv(BUG_FLAG)
        plan = await h.store.read(observe_resume.plan_resume, run_id, 2)
        assert not plan.refused and plan.needs_force
        (forced,) = plan.forced
        assert forced["step_no"] == 2 and forced["state"] == "confirmed" and forced["key"]
        for reason in (None, "  "):  # a force without a reason changes nothing
            with pytest.raises(ResumeRefused, match="needs a reason"):
                await h.store.transact(
                    observe_resume.resume_run, run_id, 2, "ops:alice", reason, True
                )
        with pytest.raises(observe_resume.ResumeNeedsForce, match=forced["key"]):
            await h.store.transact(observe_resume.resume_run, run_id, 2, "ops:alice", "why")
        assert (await h.run(run_id)).status == RunStatus.FAILED
        assert len(await h.journal(run_id)) == 3
        await h.store.transact(
            observe_resume.resume_run, run_id, 2, "ops:alice", "provider refunded it", True
        )
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED, run
        assert len(payments.calls) == 2  # called again, under the same key
        (resumed,) = [e for e in await h.events(run_id) if e.type == "run.resumed"]
        assert resumed.actor == "ops:alice"
        assert resumed.data["reason"] == "provider refunded it"
        assert resumed.data["forced"] == [forced]
        assert resumed.data["archived_steps"][0]["name"] == forced["name"]


def test_cli_dry_run_and_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payments = Payments()
    h = Harness(tmp_path, booking_app(payments))

    async def seed() -> str:
        async with h:
            return await _failed_run(h, monkeypatch)

    run_id = asyncio.run(seed())
    db = f"sqlite:///{h.path}"
    runner = CliRunner()
    out = runner.invoke(
        cli, ["runs", "resume", "--status", "failed", "--agent", "booking", "--dry-run", "--db", db]
    )
    assert out.exit_code == 0, out.output
    assert f"would resume {run_id} (failed) from step 3" in out.output
    out = runner.invoke(cli, ["runs", "resume", run_id, "--from-step", "1", "--db", db])
    assert out.exit_code == 1 and "was executed" in out.output
    out = runner.invoke(cli, ["runs", "resume", run_id, "--from-step", "1", "--dry-run",
                              "--db", db])  # fmt: skip
    assert out.exit_code == 0 and "needs --force --reason R" in out.output, out.output
    out = runner.invoke(cli, ["runs", "resume", run_id, "--from-step", "1", "--force",
                              "--db", db])  # fmt: skip
    assert out.exit_code != 0 and "--force needs --reason R" in str(out.exception)
    out = runner.invoke(cli, ["runs", "resume", run_id, "--from-step", "1", "--force",
                              "--reason", "refunded by hand", "--dry-run", "--db", db])  # fmt: skip
    assert out.exit_code == 0 and f"would resume {run_id}" in out.output, out.output
    out = runner.invoke(cli, ["runs", "resume", run_id, "--from-step", "2", "--force",
                              "--reason", "refunded by hand", "--actor", "ops:eve",
                              "--db", db])  # fmt: skip
    assert out.exit_code == 0 and f"resumed {run_id}" in out.output, out.output
    assert "forced: re-executes confirmed effects 2 " in out.output

    async def resumed() -> list[Any]:
        async with h:
            return [e for e in await h.events(run_id) if e.type == "run.resumed"]

    (event,) = asyncio.run(resumed())
    assert event.actor == "ops:eve" and event.data["reason"] == "refunded by hand"
    assert [e["step_no"] for e in event.data["forced"]] == [2]
