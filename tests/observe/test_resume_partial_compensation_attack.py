"""Attacks on resuming a run whose compensation is partly applied (issue 22, review):
the dry run names every call the resumed run makes, whatever ``--from-step``; a decision
whose plan is damaged or hostile never makes a resume delete or list a step that is not
one of its failed compensations; a refund that applied is never called again unforced.

The provider is the external ledger of tests/apps/ledger.py: "money taken" is read there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentledger import App, Status, ToolContext
from agentledger.errors import BusinessError
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumePlan
from agentledger.records import RunStatus, StepStatus, dumps
from agentledger.store._tx import Tx
from tests.apps import ledger
from tests.apps.refund_booking import apply_refund, booking_app, refund_args
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_resume_settle import money_taken

#: The refunds the provider declines (names of the refund tools).
DECLINE: set[str] = set()
#: The refunds the provider applies but answers too late (after the tool's timeout).
SLOW: set[str] = set()
#: The refunds whose result cannot be journaled (the tool returns a set): they applied.
UNJOURNALABLE: set[str] = set()
#: While set, the provider's status page lags: it shows no refund (``not_found``).
LAG: set[str] = set()


async def _status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    found = ledger.status(ctx.idempotency_key)
    if found and found.get("kind") == "refund" and LAG:
        return Status.not_found()
    return Status.succeeded(found) if found else Status.not_found()


#: The refunds whose arguments cannot be built (a bug of the booking's code, since fixed).
BAD_ARGS: set[str] = set()


def _refund_args(refund: str, args: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    if refund in BAD_ARGS:
        raise KeyError("effect")
    return refund_args(refund, args, out)


async def _refund(name: str, ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
    if name in DECLINE:
        ledger.record_call(ctx.idempotency_key, "refund")
        raise BusinessError(f"{name}: declined by the provider (account locked)")
    done = apply_refund(ctx, effect_id, amount, dedupe=True)
    if name in SLOW:
        # Applied; the answer comes after the timeout (3 s, a margin for a loaded host).
        await asyncio.sleep(6)
    if name in UNJOURNALABLE:
        return {**done, "ids": {1, 2}}  # a bug of the tool: a set is not JSON
    return dict(done)


def _app(timeouts: dict[str, float] | None = None) -> App:
    """A booking that charges twice (``hotel``, then ``fee``), each compensated by its
    refund; its confirmation has a bug. A refund named in ``DECLINE`` is declined. A new
    app starts with no fault set (a test before it in the same process may have left
    one: the bulk resume test met a refund whose arguments "could not be built").
    ``timeouts``: a refund's own timeout instead of the 3 s of the others."""
    for faults in (DECLINE, SLOW, LAG, UNJOURNALABLE, BAD_ARGS):
        faults.clear()
    charges = [("charge_hotel", "refund_hotel", 100), ("charge_fee", "refund_fee", 20)]
    return booking_app(
        "partial_attack", charges, _refund, status=_status, refund_status=_status,
        refund_timeout=3, timeouts=timeouts, args_of=_refund_args,
    )  # fmt: skip


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    return Harness(tmp_path, _app(), url=store_url)


async def _compensated(h: Harness, declined: set[str]) -> str:
    """A booking whose compensation ran with the refunds in ``declined`` declined:
    steps 1-2 charges, 3 the failed confirmation, 4 the decision, 5 the fee's refund,
    6 the hotel's."""
    DECLINE.clear()
    DECLINE.update(declined)
    run_id = await h.submit("booking")
    run = await h.drive(run_id)
    assert run.status == RunStatus.NEEDS_HUMAN, run
    journal = [(s.step_no, s.kind, s.name, s.status) for s in await h.journal(run_id)]
    assert journal == [
        (1, "tool", "charge_hotel", StepStatus.SUCCEEDED),
        (2, "tool", "charge_fee", StepStatus.SUCCEEDED),
        (3, "step", "confirm", StepStatus.FAILED),
        (4, "decision", "compensate", StepStatus.SUCCEEDED),
        (5, "compensation", "refund_fee", StepStatus.FAILED if "refund_fee" in declined
         else StepStatus.SUCCEEDED),
        (6, "compensation", "refund_hotel", StepStatus.FAILED if "refund_hotel" in declined
         else StepStatus.SUCCEEDED),
    ], journal  # fmt: skip
    return run_id


async def _resume_and_compare(
    h: Harness, run_id: str, from_step: int | None, force: bool
) -> tuple[ResumePlan, list[str]]:
    """Dry run, then the resume and the engine: the keys the provider saw since."""
    plan = await h.store.read(observe_resume.plan_resume, run_id, from_step)
    assert not plan.refused, plan
    before = len(ledger.calls())
    reason = "refunds unlocked" if force else None
    await h.store.transact(observe_resume.resume_run, run_id, from_step, "ops:amy", reason, force)
    await h.drive(run_id)
    return plan, [c[0] for c in ledger.calls()[before:]]


@pytest.mark.parametrize("from_step", [None, 5, 6, 7])
async def test_the_dry_run_lists_every_compensation_called_again_whatever_the_from_step(
    harness: Harness, from_step: int | None
) -> None:
    """The fee's refund was declined, the hotel's applied. From after the decision on,
    the engine calls the declined refund again with its key; the dry run must say so
    (with that key) wherever the resume starts, not only without --from-step."""
    async with harness as h:
        run_id = await _compensated(h, {"refund_fee"})
        keys = {s.step_no: s.idempotency_key for s in await h.journal(run_id)}
        DECLINE.clear()  # the provider unlocked the fee account
        forced = from_step is not None and from_step <= 6  # the hotel's refund re-runs
        plan, called = await _resume_and_compare(h, run_id, from_step, forced)
        listed = {e["step_no"]: e for e in plan.effects}
        assert 5 in listed and listed[5]["key"] == keys[5], plan.effects
        assert listed[5]["state"] == "failed_checked", listed[5]
        assert "finish the compensation" in listed[5]["action"]
        assert set(called) <= {e["key"] for e in plan.effects}, (called, plan.effects)
        assert keys[5] in called
        run = await h.run(run_id)
        assert run.status == RunStatus.FAILED, run  # as decided
        assert money_taken("charge", "refund") == 0  # each refund applied once
        assert ledger.effect_counts(kind="refund") == {keys[5]: 1, keys[6]: 1}


@pytest.mark.parametrize("from_step", [5, 6])
async def test_from_step_after_a_decision_whose_refunds_all_failed_lists_them(
    harness: Harness, from_step: int
) -> None:
    """Both refunds were declined (nothing undone). A --from-step after the decision
    keeps it: the engine calls the archived refunds again, so the dry run lists them."""
    async with harness as h:
        run_id = await _compensated(h, {"refund_fee", "refund_hotel"})
        keys = {s.step_no: s.idempotency_key for s in await h.journal(run_id)}
        DECLINE.clear()
        plan, called = await _resume_and_compare(h, run_id, from_step, False)
        archived = set(range(from_step, 7))
        listed = {e["step_no"]: e["key"] for e in plan.effects}
        assert {n: keys[n] for n in archived} == {n: listed.get(n) for n in archived}, plan
        assert set(called) <= set(listed.values()), (called, plan.effects)
        # From 6 too, the fee's refund (5) is finished: its tool has a status check, so it
        # may have applied, and the decision stands until it is checked (not found here,
        # so it is called again with its key).
        run = await h.run(run_id)
        assert run.status == RunStatus.FAILED, run
        assert money_taken("charge", "refund") == 0
        assert ledger.effect_counts(kind="refund") == {keys[n]: 1 for n in (5, 6)}


def _set_plan(tx: Tx, run_id: str, plan: Any) -> None:
    decision = tx.fetchall(
        "SELECT output FROM steps WHERE run_id = :id AND kind = 'decision'", {"id": run_id}
    )[0]["output"]
    from agentledger.records import loads

    output = loads(decision)
    output["plan"] = plan
    tx.execute(
        "UPDATE steps SET output = :o WHERE run_id = :id AND kind = 'decision'",
        {"o": dumps(output), "id": run_id},
    )


HOSTILE = [
    [2, 5], [2, 5], [1, 1], [1, True], [1, -3], [1, 0], [1, 2**40], [1, "5"], [1, 5.0],
    [3, 2], [1, 3], [1, 4], [1, 6], [1], [1, 5, 6], "5", None, {"1": 5},
]  # fmt: skip


async def test_a_hostile_plan_never_deletes_or_lists_another_step(harness: Harness) -> None:
    """The decision's plan names the fee's declined refund twice, forward steps, the
    decision itself, the applied refund, negative, zero, huge and non-integer numbers
    and rows of other shapes: the resume archives and lists the declined refund once,
    and deletes nothing else."""
    async with harness as h:
        run_id = await _compensated(h, {"refund_fee"})
        await h.store.transact(_set_plan, run_id, HOSTILE)
        before = {s.step_no: s for s in await h.journal(run_id)}
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        assert not plan.refused and not plan.needs_force, plan
        assert plan.compensations_checked == [5] and plan.compensations_again == [], plan
        assert [e["step_no"] for e in plan.effects] == [5], plan.effects
        assert plan.reexecute == [], plan.reexecute
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "hostile")
        after = {s.step_no: s for s in await h.journal(run_id)}
        assert sorted(after) == [1, 2, 3, 4, 5, 6]
        assert all(after[n].status == before[n].status for n in after)
        (event,) = [e for e in await h.events(run_id) if e.type == "run.resumed"]
        assert event.data["archived_steps"] == [] and event.data["compensations_checked"] == [5]
        assert (await h.run(run_id)).step_count == 6


async def test_a_refund_failed_after_its_status_check_lagged_is_not_applied_twice(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fee's refund applied, but every answer came after the timeout and the
    provider's status page lagged (``not_found``) until the engine's same-key resends
    were used up: the journal says failed (the status checks "proved" it not applied).
    The resume calls it again with the same key; the provider, which honours keys,
    applies nothing more: the fee is refunded once.

    The fee's refund times out sooner than the others: every attempt before the resume
    waits out its whole timeout. The resumed call may time out too on a stalled host
    (it applied nothing new): its status check, no longer lagging, finds it applied."""
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    async with Harness(tmp_path, _app({"refund_fee": 1.0}), url=store_url) as h:
        SLOW.add("refund_fee")
        LAG.add("refund")
        run_id = await h.submit("booking")
        run = await h.drive(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        journal = {s.step_no: s for s in await h.journal(run_id)}
        assert journal[5].status == StepStatus.FAILED, journal[5]
        assert journal[5].error_class == "timeout" and "not found" in str(journal[5].error)
        key = journal[5].idempotency_key
        assert ledger.effect_counts(kind="refund")[key] == 1  # it did apply
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        assert plan.compensations_checked == [5] and plan.effects[0]["key"] == key
        SLOW.clear()
        LAG.clear()
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "retry")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert {s.step_no: s for s in await h.journal(run_id)}[5].idempotency_key == key
        assert ledger.effect_counts(kind="refund") == {key: 1, journal[6].idempotency_key: 1}
        assert money_taken("charge", "refund") == 0


@pytest.mark.parametrize("declined", [{"refund_fee"}, set()])
async def test_a_refund_that_applied_but_whose_result_was_not_journaled_counts_as_done(
    harness: Harness, declined: set[str]
) -> None:
    """The hotel's refund applied but its result could not be journaled (the step says
    failed, ``not_journalable``: a confirmed effect), the fee's refund was declined or
    applied. The resume counts the hotel's refund as done (never calls it again), and the
    resumed run ends as decided, instead of handing itself back to a person forever."""
    async with harness as h:
        UNJOURNALABLE.add("refund_hotel")
        DECLINE.update(declined)
        run_id = await h.submit("booking")
        run = await h.drive(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        journal = {s.step_no: s for s in await h.journal(run_id)}
        assert (journal[6].status, journal[6].error_class) == ("failed", "not_journalable")
        keys = {n: s.idempotency_key for n, s in journal.items()}
        DECLINE.clear()
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        assert not plan.refused and not plan.needs_force, plan
        assert plan.compensations_checked == ([5] if declined else []), plan
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "go")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run  # as decided
        assert money_taken("charge", "refund") == 0
        assert ledger.effect_counts(kind="refund") == {keys[5]: 1, keys[6]: 1}
        assert ledger.call_counts(kind="refund")[keys[6]] == 1  # never called again


async def test_the_dry_run_names_the_key_of_a_refund_whose_arguments_could_not_be_built(
    harness: Harness,
) -> None:
    """The fee's refund never reached the provider (its arguments could not be built, so
    its journal entry has no key); the code is fixed. The dry run names the key the
    resumed run then sends, not none."""
    async with harness as h:
        BAD_ARGS.add("refund_fee")
        run_id = await h.submit("booking")
        assert (await h.drive(run_id)).status == RunStatus.NEEDS_HUMAN
        journal = {s.step_no: s for s in await h.journal(run_id)}
        assert journal[5].status == StepStatus.FAILED and journal[5].idempotency_key is None
        BAD_ARGS.clear()
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        assert plan.compensations_again == [5], plan
        listed = plan.effects[0]["key"]
        before = len(ledger.calls())
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "fixed")
        assert (await h.drive(run_id)).status == RunStatus.FAILED
        assert [c[0] for c in ledger.calls()[before:]] == [listed]
        assert {s.step_no: s for s in await h.journal(run_id)}[5].idempotency_key == listed
        assert money_taken("charge", "refund") == 0
