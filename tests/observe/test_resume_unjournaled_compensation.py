"""A resume that keeps a compensation decision whose plan names a compensation the
journal never held: the tool lost its compensation in a deploy between the decision and
that compensation (the engine handed the run over, "its tool no longer declares a
compensation"), and a later deploy brought it back. The resumed engine calls it, with
the plan's key; the dry run must list that call, with that key (issue 22, review).

The provider is the external ledger of tests/apps/ledger.py: the keys it saw are
compared with the keys the dry run listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, ToolContext
from agentledger.errors import BusinessError
from agentledger.observe._queries import resume as observe_resume
from agentledger.records import RunStatus, StepStatus
from tests.apps import ledger
from tests.apps.refund_booking import apply_refund, booking_app
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_resume_partial_compensation_attack import _status
from tests.observe.test_resume_settle import money_taken

#: The refunds the provider declines.
DECLINE: set[str] = set()
#: While set, the fee's refund drops the hotel charge's compensation from the code the
#: worker runs (a deploy between the two compensations), once.
LOSE: set[str] = set()


#: The app being run (the fee's refund changes its hotel charge, as a deploy would).
APP: list[App] = []


async def _refund(name: str, ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
    if LOSE:
        LOSE.clear()
        APP[-1].tools["charge_hotel"].compensation = None
    if name in DECLINE:
        ledger.record_call(ctx.idempotency_key, "refund")
        raise BusinessError(f"{name}: declined by the provider (account locked)")
    return apply_refund(ctx, effect_id, amount, dedupe=True)


def _app() -> App:
    """A booking that charges the hotel, then a fee (each refunded by its compensation),
    then fails to confirm: the decision plans the fee's refund at 5, the hotel's at 6."""
    charges = [("charge_hotel", "refund_hotel", 100), ("charge_fee", "refund_fee", 20)]
    app = booking_app("unjournaled", charges, _refund, status=_status, refund_status=_status)
    APP[:] = [app]
    return app


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    DECLINE.clear()
    LOSE.clear()
    return Harness(tmp_path, _app(), url=store_url)


@pytest.mark.parametrize(
    ("fee_declined", "from_step"),
    [(False, None), (False, 6), (True, 5), (True, 6)],
)
async def test_the_dry_run_lists_a_compensation_the_journal_never_held(
    harness: Harness, fee_declined: bool, from_step: int | None
) -> None:
    """The fee's refund (5) applied or was declined; the hotel's (6) was never called,
    its compensation gone from the code then. Restored, a resume that keeps the decision
    has the engine call it with key ``<run>:6``: the dry run lists exactly the keys the
    provider then sees."""
    async with harness as h:
        kept = h.app.tools["charge_hotel"].compensation
        LOSE.add("once")
        if fee_declined:
            DECLINE.add("refund_fee")
        run_id = await h.submit("booking")
        run = await h.drive(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        journal = [(s.step_no, s.kind, s.name, s.status) for s in await h.journal(run_id)]
        assert journal == [
            (1, "tool", "charge_hotel", StepStatus.SUCCEEDED),
            (2, "tool", "charge_fee", StepStatus.SUCCEEDED),
            (3, "step", "confirm", StepStatus.FAILED),
            (4, "decision", "compensate", StepStatus.SUCCEEDED),
            (5, "compensation", "refund_fee",
             StepStatus.FAILED if fee_declined else StepStatus.SUCCEEDED),
        ], journal  # fmt: skip
        h.app.tools["charge_hotel"].compensation = kept  # the next deploy
        DECLINE.clear()

        plan = await h.store.read(observe_resume.plan_resume, run_id, from_step)
        assert not plan.refused and not plan.needs_force, plan
        listed = {e["step_no"]: e for e in plan.effects}
        assert listed[6]["key"] == f"{run_id}:6", plan.effects
        assert listed[6]["state"] == "not_called" and listed[6]["kind"] == "compensation"
        before = len(ledger.calls())
        await h.store.transact(observe_resume.resume_run, run_id, from_step, "ops:amy", "back")
        run = await h.drive(run_id)
        called = [c[0] for c in ledger.calls()[before:]]
        assert sorted(called) == sorted(e["key"] for e in plan.effects), (called, plan.effects)
        # Every refund applied once and the run ended failed (from 6 too: the declined
        # fee refund has a status check, so the decision stands and it is finished).
        assert run.status == RunStatus.FAILED, run
        assert money_taken("charge", "refund") == 0
