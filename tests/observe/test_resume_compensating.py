"""A run whose compensation's outcome is unknown (the refund timed out) is resumed into
finishing that compensation: never forward past a refund that may have happened, never
with the compensation left behind in the journal where forward steps would land
(issue 19, second review, point 4).

The provider is the external ledger of tests/apps/ledger.py: "money taken" is read there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, Status, ToolContext
from agentledger.errors import ToolTimeout
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.records import RunStatus, StepStatus
from agentledger.tools._contract import Compensation, RetryPolicy
from tests.apps import ledger
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_resume_settle import money_taken

STATE: dict[str, Any] = {}


async def _refund_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    if STATE["status_down"]:
        raise ConnectionError("status endpoint down")
    found = ledger.status(ctx.idempotency_key)
    return Status.succeeded(found) if found else Status.not_found()


def _app() -> App:
    """``charge`` (keyed, status check) compensated by ``refund`` (keyed, its status
    check may be down) or, for ``booking_blind``, by ``refund_blind`` (effects table, no
    status check); then ``confirm`` (a bug) and ``notify`` (a second forward write)."""
    app = App("compensating")

    async def charge_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        found = ledger.status(ctx.idempotency_key)
        return Status.succeeded(found) if found else Status.not_found()

    @app.tool(effect="money", idempotency="provider", status_check=_refund_status, timeout=5,
              retry=RetryPolicy(base_delay=0))  # fmt: skip
    async def refund(ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
        payload = {"effect_id": effect_id, "amount": amount}
        result = ledger.apply(ctx.idempotency_key, "refund", dedupe=True, payload=payload)
        if STATE["refund_timeout"]:
            STATE["refund_timeout"] = False
            raise ToolTimeout("refund: no answer (the provider applied it)")
        return result

    @app.tool(effect="money", idempotency="effects", timeout=5, retry=RetryPolicy(base_delay=0))
    async def refund_blind(ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
        payload = {"effect_id": effect_id, "amount": amount}
        if STATE["refund_timeout"] == "before":
            STATE["refund_timeout"] = False
            ledger.record_call(ctx.idempotency_key, "refund")
            raise ToolTimeout("refund: no answer (it never reached the provider)")
        result = ledger.apply(ctx.idempotency_key, "refund", dedupe=False, payload=payload)
        if STATE["refund_timeout"]:
            STATE["refund_timeout"] = False
            raise ToolTimeout("refund: no answer (the provider applied it)")
        return result

    def _comp(tool: str) -> Compensation:
        return Compensation(
            tool, lambda args, out: {"effect_id": out["effect_id"], "amount": args["amount"]}
        )

    for name, comp in (("charge", "refund"), ("charge_blind", "refund_blind")):

        @app.tool(name=name, effect="money", idempotency="provider", status_check=charge_status,
                  timeout=5, compensation=_comp(comp))  # fmt: skip
        async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
            return ledger.apply(ctx.idempotency_key, "charge", dedupe=True, payload=amount)

    @app.tool(effect="write", idempotency="provider", timeout=5)
    async def notify(ctx: ToolContext, text: str) -> dict[str, Any]:
        return ledger.apply(ctx.idempotency_key, "notify", dedupe=True, payload=text)

    def _booking(charge_tool: str) -> Any:
        async def booking(ctx: Any, input: Any) -> Any:
            charged = await ctx.tool(charge_tool, amount=120)

            def confirm() -> dict[str, Any]:
                if STATE["bug"]:
                    raise RuntimeError("confirm: bug in the confirmation code")
                return {"charge": charged["effect_id"], "amount": 120}

            done = await ctx.step("confirm", confirm)
            await ctx.tool("notify", text="booked")
            await ctx.tool("notify", text="receipt")
            return done

        return booking

    app.workflow(name="booking")(_booking("charge"))
    app.workflow(name="booking_blind")(_booking("charge_blind"))
    return app


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    STATE.update(status_down=False, refund_timeout=False, bug=False)
    return Harness(tmp_path, _app(), url=store_url)


async def _refund_in_doubt(h: Harness, name: str, timeout: Any = True) -> str:
    """A booking whose confirm failed, whose charge's refund has an unknown outcome."""
    STATE.update(bug=True, refund_timeout=timeout, status_down=True)
    run_id = await h.submit(name)
    run = await h.drive(run_id)
    assert run.status == RunStatus.NEEDS_HUMAN, run
    kinds = [(s.kind, s.status) for s in await h.journal(run_id)]
    assert kinds == [
        ("tool", StepStatus.SUCCEEDED),
        ("step", StepStatus.FAILED),
        ("decision", StepStatus.SUCCEEDED),
        ("compensation", StepStatus.UNKNOWN),
    ], kinds
    STATE.update(bug=False, status_down=False)  # the fix is deployed, the provider is back
    return run_id


def _agree(run: Any) -> None:
    taken = run.result["amount"] if run.status == RunStatus.COMPLETED else 0
    assert money_taken("charge", "refund") == taken, run
    assert ledger.count_calls(kind="notify") == (2 if run.status == RunStatus.COMPLETED else 0)


async def test_an_unknown_refund_with_a_status_check_is_finished_not_walked_past(
    harness: Harness,
) -> None:
    async with harness as h:
        run_id = await _refund_in_doubt(h, "booking")
        assert money_taken("charge", "refund") == 0  # the refund happened at the provider
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        assert [(e["step_no"], e["state"]) for e in plan.effects] == [(4, "unknown")], plan
        assert not plan.refused and plan.reexecute == []
        await h.store.transact(
            observe_resume.resume_run, run_id, None, "ops:amy", "status endpoint back"
        )
        run = await h.drive(run_id)
        # One resume settles it: the refund is status-checked (found), the run ends as
        # decided, no forward write is sent on a refunded charge.
        assert run.status == RunStatus.FAILED, run
        assert ledger.count_calls(kind="refund") == 1
        _agree(run)


@pytest.mark.parametrize("applied", [True, False])
async def test_a_settled_refund_is_finished_by_the_resume(harness: Harness, applied: bool) -> None:
    async with harness as h:
        run_id = await _refund_in_doubt(h, "booking_blind", True if applied else "before")
        with pytest.raises(ResumeRefused, match="runs settle"):
            await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "fixed")
        seen = ledger.effects(kind="refund")
        assert len(seen) == (1 if applied else 0)
        await h.store.transact(
            observe_resume.settle_step,
            run_id,
            4,
            applied,
            seen[0] if applied else None,
            "ops:amy",
            "looked",
        )
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "settled")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert len(ledger.effects(kind="refund")) == 1
        _agree(run)


@pytest.mark.parametrize("from_step", [2, 3])
async def test_from_step_before_an_unsettled_compensation_is_refused(
    harness: Harness, from_step: int
) -> None:
    """Going forward again would leave the refund in flight in the journal, at a step
    number the forward steps then reach."""
    async with harness as h:
        run_id = await _refund_in_doubt(h, "booking")
        before = [(s.step_no, s.status) for s in await h.journal(run_id)]
        with pytest.raises(ResumeRefused, match="compensation"):
            await h.store.transact(
                observe_resume.resume_run, run_id, from_step, "ops:amy", "go forward"
            )
        assert [(s.step_no, s.status) for s in await h.journal(run_id)] == before
        assert (await h.run(run_id)).status == RunStatus.NEEDS_HUMAN
        # The default resume still finishes it.
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "finish it")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        _agree(run)
