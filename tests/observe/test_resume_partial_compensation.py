"""A run with one compensation applied and another failed (a refund declined) is
resumed into finishing its compensation: the failed refund is called again with its own
key, the applied one stands, and the run ends as decided. It is never walked forward
past the refund that happened, forced or not (issue 22).

The provider is the external ledger of tests/apps/ledger.py: "money taken" is read there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, Status, ToolContext
from agentledger.errors import BusinessError
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.records import RunStatus, StepStatus
from tests.apps import ledger
from tests.apps.refund_booking import apply_refund, booking_app
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_resume_settle import money_taken

STATE: dict[str, Any] = {}


async def _status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    found = ledger.status(ctx.idempotency_key)
    return Status.succeeded(found) if found else Status.not_found()


async def _refund(name: str, ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
    if name == "refund_fee" and STATE["decline"]:
        ledger.record_call(ctx.idempotency_key, "refund")
        raise BusinessError("refund_fee: declined by the provider (fee account locked)")
    return apply_refund(ctx, effect_id, amount, dedupe=True)


def _app() -> App:
    """A booking that charges twice (``hotel``, then ``fee``), each compensated by a
    refund; its confirmation has a bug. The fee's refund is declined while
    ``STATE["decline"]``."""
    charges = [("charge_hotel", "refund", 100), ("charge_fee", "refund_fee", 20)]
    return booking_app("partial", charges, _refund, status=_status, refund_status=_status)


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    STATE.update(decline=True)
    return Harness(tmp_path, _app(), url=store_url)


async def _partly_compensated(h: Harness) -> str:
    run_id = await h.submit("booking")
    run = await h.drive(run_id)
    assert run.status == RunStatus.NEEDS_HUMAN and "refund_fee" in str(run.handover_reason), run
    journal = [(s.step_no, s.kind, s.name, s.status) for s in await h.journal(run_id)]
    assert journal == [
        (1, "tool", "charge_hotel", StepStatus.SUCCEEDED),
        (2, "tool", "charge_fee", StepStatus.SUCCEEDED),
        (3, "step", "confirm", StepStatus.FAILED),
        (4, "decision", "compensate", StepStatus.SUCCEEDED),
        (5, "compensation", "refund_fee", StepStatus.FAILED),
        (6, "compensation", "refund", StepStatus.SUCCEEDED),
    ], journal
    assert money_taken("charge", "refund") == 20  # the hotel refunded, the fee not
    return run_id


async def test_the_failed_refund_is_called_again_and_the_run_ends_as_decided(
    harness: Harness,
) -> None:
    async with harness as h:
        run_id = await _partly_compensated(h)
        key = {s.step_no: s.idempotency_key for s in await h.journal(run_id)}[5]
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        # The dry run names the failed refund as what the resume does, with its key and
        # why it failed; nothing to force, nothing refused.
        assert not plan.refused and not plan.needs_force, plan
        # Its tool has a status check: the provider is asked first, then it is called.
        assert plan.compensations_checked == [5] and plan.compensations_again == []
        assert plan.confirmed == []
        (effect,) = plan.effects
        assert (effect["step_no"], effect["state"], effect["key"]) == (5, "failed_checked", key)
        assert "finish the compensation" in effect["action"] and "declined" in effect["action"]
        assert "status-checked with this key first" in effect["action"]

        # Still declined: back to needs_human, and resumable again (never refused for good).
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "retry")
        run = await h.drive(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        assert money_taken("charge", "refund") == 20

        STATE["decline"] = False  # the provider unlocked the fee account
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "unlocked")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run  # as decided: the booking failed
        assert money_taken("charge", "refund") == 0
        journal = {s.step_no: s for s in await h.journal(run_id)}
        assert journal[5].status == StepStatus.SUCCEEDED and journal[5].idempotency_key == key
        # Each charge and the hotel's refund reached the provider once; the fee's refund
        # three times, always with its one key.
        assert ledger.call_counts(kind="charge") == {journal[1].idempotency_key: 1,
                                                     journal[2].idempotency_key: 1}  # fmt: skip
        assert ledger.call_counts(kind="refund") == {key: 3, journal[6].idempotency_key: 1}
        resumed = [e for e in await h.events(run_id) if e.type == "run.resumed"]
        # Kept and marked for its status check each time, never archived.
        assert [[s["step_no"] for s in e.data["archived_steps"]] for e in resumed] == [[], []]
        assert [e.data["compensations_checked"] for e in resumed] == [[5], [5]]
        assert all(e.data["forced"] is None for e in resumed)


@pytest.mark.parametrize("from_step", [3, 4])
async def test_going_forward_past_the_refund_that_happened_is_refused_even_forced(
    harness: Harness, from_step: int
) -> None:
    async with harness as h:
        run_id = await _partly_compensated(h)
        before = [(s.step_no, s.status) for s in await h.journal(run_id)]
        with pytest.raises(ResumeRefused, match="compensating") as refused:
            await h.store.transact(
                observe_resume.resume_run, run_id, from_step, "ops:amy", "go forward", True
            )
        assert "step 5 (refund_fee) failed" in str(refused.value), refused.value
        assert [(s.step_no, s.status) for s in await h.journal(run_id)] == before
        assert (await h.run(run_id)).status == RunStatus.NEEDS_HUMAN
        assert money_taken("charge", "refund") == 20
