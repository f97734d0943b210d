"""A status check answering nonsense when a failed compensation is rechecked.

A resumed run asks the provider about a failed refund before calling it again
(engine/_compensation.py, ``_recheck``). A check that answers something that is no
:class:`~agentledger.Status` (a dict, a string: a bug in the check) could not tell, as
when it answers ``pending``: the refund is not called, and the run goes back to a
person with both ``runs settle`` commands -- never a crash of the engine, which would
leave the run to be claimed, asked and crashed again each time its lease expired.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, Status, ToolContext
from agentledger.errors import BusinessError
from agentledger.observe._queries import resume as observe_resume
from agentledger.records import RunStatus, StepStatus
from tests.apps import ledger
from tests.apps.refund_booking import apply_refund, booking_app
from tests.fast.lifecycle_harness import Harness

REFUND = 4  # 1 charge, 2 confirm (fails), 3 decision, 4 refund
#: What the status check answers instead of a Status (None: a Status).
ANSWER: list[Any] = [None]


async def _status(ctx: ToolContext, args: dict[str, Any]) -> Any:
    found = ledger.status(ctx.idempotency_key)
    if ANSWER[0] is not None:
        return ANSWER[0]
    return Status.succeeded(found) if found else Status.not_found()


async def _refund(name: str, ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
    apply_refund(ctx, effect_id, amount, dedupe=False)
    raise BusinessError("refund: declined by the provider (reported after applying)")


def _app() -> App:
    """A booking whose refund applies, then reports a failure (its answer lies)."""
    charges = [("charge", "refund", 100)]
    return booking_app("nonsense", charges, _refund, status=_status, refund_status=_status)


@pytest.mark.parametrize("nonsense", [{"state": "succeeded"}, "succeeded"])
async def test_a_recheck_answered_nonsense_is_handed_to_a_person_uncalled(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, nonsense: Any
) -> None:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    ANSWER[0] = None
    async with Harness(tmp_path, _app(), url=store_url) as h:
        run_id = await h.submit("booking")
        assert (await h.drive(run_id)).status == RunStatus.NEEDS_HUMAN
        key = {s.step_no: s.idempotency_key for s in await h.journal(run_id)}[REFUND]
        assert ledger.call_counts(kind="refund") == {key: 1}
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "look")
        ANSWER[0] = nonsense
        try:
            run = await h.drive(run_id, passes=1)
        finally:
            ANSWER[0] = None
        assert run.status == RunStatus.NEEDS_HUMAN, run
        reason = str(run.handover_reason)
        assert "not_a_status" in reason, reason
        assert f"runs settle {run_id} {REFUND} --applied" in reason, reason
        assert f"runs settle {run_id} {REFUND} --not-applied" in reason, reason
        assert ledger.call_counts(kind="refund") == {key: 1}  # not called again
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert step.status == StepStatus.FAILED and step.input["recheck"]["answer"] == "unknown"
