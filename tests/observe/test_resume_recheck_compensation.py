"""A failed compensation is never applied twice, and a person can record one done.

A refund the provider applied but reported failed (its answer lied, or came from a
provider that does not dedupe keys) is status-checked before a resume calls it again:
applied -> recorded done, not called; not applied -> called again once, with its key;
the check cannot tell -> not called, the run stays with a person. ``runs settle`` takes
a failed compensation as applied (or not), so the following resume does not call it;
it refuses any other step that is not an unknown write with a one-line message.

The provider is the external ledger of tests/apps/ledger.py: its refunds, calls and
status checks are counted there. Its refund does NOT dedupe keys, so a second call of an
applied refund refunds twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentledger import App, Status, ToolContext
from agentledger.cli._main import cli
from agentledger.errors import BusinessError, RateLimited
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.records import RunStatus, StepStatus
from tests.apps import ledger
from tests.apps.refund_booking import apply_refund, booking_app
from tests.fast.lifecycle_harness import KILLED, Harness, Killed

#: The refund is applied, then reported declined (the provider's answer lies).
LIE: set[str] = set()
#: The refund is declined (nothing applied).
DECLINE: set[str] = set()
#: The status check cannot ask (the provider's status page is down).
CHECK_DOWN: set[str] = set()
#: The worker dies right after the status check answered, before anything is journaled.
KILL_AFTER_CHECK: set[str] = set()
#: The worker dies as the refund is called, before it reaches the provider.
KILL_AT_CALL: set[str] = set()
#: Run once right after the status check answered (another worker takes the run over).
AFTER_CHECK: list[Callable[[], Awaitable[Any]]] = []
REFUND = 4  # the refund's step: 1 charge, 2 confirm, 3 decision, 4 refund


async def _status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    if CHECK_DOWN:
        raise RuntimeError("status page unavailable")
    found = ledger.status(ctx.idempotency_key)
    if KILL_AFTER_CHECK:
        KILL_AFTER_CHECK.clear()
        raise Killed("the worker died after the status check answered")
    while AFTER_CHECK:
        await AFTER_CHECK.pop()()
    return Status.succeeded(found) if found else Status.not_found()


async def _refund(name: str, ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
    if KILL_AT_CALL:
        KILL_AT_CALL.clear()
        raise Killed("the worker died calling the refund")
    if DECLINE:
        ledger.record_call(ctx.idempotency_key, "refund")
        raise BusinessError("refund: declined by the provider (account locked)")
    done = apply_refund(ctx, effect_id, amount, dedupe=False)
    if LIE:
        raise BusinessError("refund: declined by the provider (reported after applying)")
    return dict(done)


def _app(checked: bool = True) -> App:
    """A booking that charges (refunded by its compensation), then fails to confirm.
    ``checked``: the refund has a status check."""
    for faults in (LIE, DECLINE, CHECK_DOWN, KILL_AFTER_CHECK, KILL_AT_CALL):
        faults.clear()
    AFTER_CHECK.clear()
    return booking_app(
        "recheck", [("charge", "refund", 100)], _refund,
        status=_status, refund_status=_status if checked else None,
    )  # fmt: skip


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    return Harness(tmp_path, _app(), url=store_url)


async def _refund_failed(h: Harness, fault: set[str]) -> tuple[str, str]:
    """A run whose refund failed (with ``fault`` set), handed to a person; its key."""
    fault.add("on")
    run_id = await h.submit("booking")
    run = await h.drive(run_id)
    fault.clear()
    assert run.status == RunStatus.NEEDS_HUMAN and "refund" in str(run.handover_reason), run
    journal = [(s.step_no, s.kind, s.name, s.status) for s in await h.journal(run_id)]
    assert journal == [
        (1, "tool", "charge", StepStatus.SUCCEEDED),
        (2, "step", "confirm", StepStatus.FAILED),
        (3, "decision", "compensate", StepStatus.SUCCEEDED),
        (REFUND, "compensation", "refund", StepStatus.FAILED),
    ], journal
    key = {s.step_no: s.idempotency_key for s in await h.journal(run_id)}[REFUND]
    assert key is not None
    return run_id, key


def _checks(key: str) -> int:
    return len(ledger._rows(None, "SELECT id FROM checks WHERE key = ?", (key,)))


async def test_a_refund_applied_but_reported_failed_is_not_refunded_twice(
    harness: Harness,
) -> None:
    async with harness as h:
        run_id, key = await _refund_failed(h, LIE)
        assert ledger.effect_counts(kind="refund") == {key: 1}  # it did apply
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "look")
        run = await h.drive(run_id)
        assert ledger.effect_counts(kind="refund") == {key: 1}  # refunded once
        assert ledger.call_counts(kind="refund") == {key: 1}  # and called once
        assert run.status == RunStatus.FAILED, run  # as decided: the booking failed
        # The dry run said the refund is asked about first, with its key.
        assert not plan.refused and not plan.needs_force, plan
        assert plan.compensations_checked == [REFUND] and plan.compensations_again == []
        (effect,) = plan.effects
        state = (effect["step_no"], effect["state"], effect["key"])
        assert state == (REFUND, "failed_checked", key)
        assert "status-checked" in effect["action"], effect
        assert _checks(key) == 1
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert step.status == StepStatus.SUCCEEDED and step.idempotency_key == key
        assert step.output["effect_id"] == ledger.effects(kind="refund")[0]["effect_id"]
        events = {e.type: e for e in await h.events(run_id)}
        assert events["compensation.rechecked"].data["answer"] == "applied", events
        assert "compensation.done" in events


async def test_a_refund_the_check_shows_not_applied_is_called_again_once(
    harness: Harness,
) -> None:
    async with harness as h:
        run_id, key = await _refund_failed(h, DECLINE)
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "unlocked")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.call_counts(kind="refund") == {key: 2}  # declined, then applied
        assert ledger.effect_counts(kind="refund") == {key: 1}
        assert _checks(key) == 1  # asked once, before the second call
        events = {e.type: e for e in await h.events(run_id)}
        assert events["compensation.rechecked"].data["answer"] == "not_applied", events


async def test_a_status_check_that_fails_leaves_the_run_with_a_person_and_no_call(
    harness: Harness,
) -> None:
    async with harness as h:
        run_id, key = await _refund_failed(h, DECLINE)
        CHECK_DOWN.add("on")
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "unlocked")
        run = await h.drive(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        assert "status check" in str(run.handover_reason), run.handover_reason
        assert f"runs settle {run_id} {REFUND}" in str(run.handover_reason)
        assert ledger.call_counts(kind="refund") == {key: 1}  # only the declined call
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert step.status == StepStatus.FAILED

        # The status page is back: the next resume asks again, then calls it once.
        CHECK_DOWN.clear()
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "back")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.call_counts(kind="refund") == {key: 2}
        assert ledger.effect_counts(kind="refund") == {key: 1}


async def test_a_failed_refund_settled_applied_is_not_called_on_resume(
    harness: Harness,
) -> None:
    async with harness as h:
        run_id, key = await _refund_failed(h, LIE)
        shown = ledger.status(key)
        step = await h.store.transact(
            observe_resume.settle_step, run_id, REFUND, True, shown, "ops:bob", "ledger shows it"
        )
        assert step.status == StepStatus.SUCCEEDED
        # The same decision again (a lost reply) is a no-op.
        await h.store.transact(
            observe_resume.settle_step, run_id, REFUND, True, shown, "ops:bob", "ledger shows it"
        )
        settled = [e for e in await h.events(run_id) if e.type == "step.settled"]
        assert [(e.actor, e.data["applied"], e.data["was"]) for e in settled] == [
            ("ops:bob", True, StepStatus.FAILED)
        ]
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        assert plan.compensations_checked == [] and plan.compensations_again == [], plan
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "settled")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.call_counts(kind="refund") == {key: 1}
        assert ledger.effect_counts(kind="refund") == {key: 1}
        journal = {s.step_no: s for s in await h.journal(run_id)}
        assert journal[REFUND].status == StepStatus.SUCCEEDED
        assert journal[REFUND].input["settled"]["by"] == "ops:bob"


async def test_settle_refuses_a_succeeded_or_forward_step_in_one_line(harness: Harness) -> None:
    async with harness as h:
        run_id, _ = await _refund_failed(h, DECLINE)
        before = [(s.step_no, s.status) for s in await h.journal(run_id)]
        for step_no in (1, 2, 3):  # the charge (succeeded), confirm (failed), the decision
            with pytest.raises(ResumeRefused) as refused:
                await h.store.transact(
                    observe_resume.settle_step, run_id, step_no, True, {}, "ops:bob", "why"
                )
            text = str(refused.value)
            assert "\n" not in text and "nothing to settle" in text, text
            assert "a failed compensation" in text and "runs resume" in text, text
        assert [(s.step_no, s.status) for s in await h.journal(run_id)] == before


def test_cli_settles_a_failed_compensation_and_refuses_a_charge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    h = Harness(tmp_path, _app())

    async def seed() -> tuple[str, str]:
        async with h:
            return await _refund_failed(h, LIE)

    run_id, key = asyncio.run(seed())
    db = f"sqlite:///{h.path}"
    runner = CliRunner()
    out = runner.invoke(cli, ["runs", "resume", run_id, "--dry-run", "--db", db])
    assert out.exit_code == 0, out.output
    label = "failed (it may have applied: asked first)"
    assert f"{REFUND} refund: {label}, key {key} -> status-checked" in out.output
    out = runner.invoke(cli, ["runs", "settle", run_id, "1", "--applied", "--result", "{}",
                              "--reason", "why", "--db", db])  # fmt: skip
    said = out.output + str(out.exception)
    assert out.exit_code != 0 and "nothing to settle" in said and "\n" not in said.strip(), said
    out = runner.invoke(cli, ["runs", "settle", run_id, str(REFUND), "--applied", "--result",
                              '{"refunded": true}', "--reason", "ledger shows it",
                              "--db", db])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert f"settled step {REFUND} (refund, key {key})" in out.output

    async def finish() -> None:
        async with h:
            await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "done")
            run = await h.drive(run_id)
            assert run.status == RunStatus.FAILED, run

    asyncio.run(finish())
    assert ledger.call_counts(kind="refund") == {key: 1}


async def test_a_kill_between_the_check_and_its_journal_write_asks_again(
    harness: Harness,
) -> None:
    """The check answered "applied" and the worker died before journaling it: the mark
    is not spent, the next owner asks again and records it; refunded once."""
    async with harness as h:
        run_id, key = await _refund_failed(h, LIE)
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "look")
        KILL_AFTER_CHECK.add("on")
        assert await h.execute(run_id) == KILLED
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert step.status == StepStatus.FAILED and "answer" not in step.input["recheck"]
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.effect_counts(kind="refund") == {key: 1}
        assert ledger.call_counts(kind="refund") == {key: 1}
        assert _checks(key) == 2


async def test_a_kill_as_the_refund_is_called_again_is_checked_not_called_blind(
    harness: Harness,
) -> None:
    """The check said not applied, ``started`` was journaled, the worker died calling:
    the next owner finds the refund in flight and asks again before calling it once."""
    async with harness as h:
        run_id, key = await _refund_failed(h, DECLINE)
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "unlocked")
        KILL_AT_CALL.add("on")
        assert await h.execute(run_id) == KILLED
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert step.status == StepStatus.STARTED and step.idempotency_key == key
        assert step.input["recheck"]["answer"] == "not_applied"
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.call_counts(kind="refund") == {key: 2}  # declined, then applied
        assert ledger.effect_counts(kind="refund") == {key: 1}
        assert _checks(key) == 2  # before the first call again, and for the one in flight


async def test_a_failed_refund_settled_not_applied_is_called_again_without_a_check(
    harness: Harness,
) -> None:
    async with harness as h:
        run_id, key = await _refund_failed(h, DECLINE)
        await h.store.transact(
            observe_resume.settle_step, run_id, REFUND, False, None, "ops:bob", "not there"
        )
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        # Nothing was undone: the resume goes forward from the failed step again (the
        # decision and the refund archived); failing again, the refund is called again.
        assert plan.from_step == 2 and plan.compensations_checked == [], plan
        (effect,) = plan.effects
        assert effect["step_no"] == REFUND and "WITHOUT a status check" in effect["action"]
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "go")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.call_counts(kind="refund") == {key: 2}
        assert ledger.effect_counts(kind="refund") == {key: 1}
        assert _checks(key) == 0


async def test_a_refund_with_no_status_check_is_called_again_and_the_dry_run_says_so(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No status check: nothing can be asked. The refund is called again with its key as
    before (its provider's "declined" is taken as nothing applied), and the dry run says
    it is called WITHOUT a check and how to settle it applied instead."""
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    async with Harness(tmp_path, _app(checked=False), url=store_url) as h:
        run_id, key = await _refund_failed(h, DECLINE)
        plan = await h.store.read(observe_resume.plan_resume, run_id, None)
        assert plan.from_step == 2 and plan.compensations_checked == [], plan
        (effect,) = plan.effects
        assert (effect["step_no"], effect["key"]) == (REFUND, key), effect
        assert "WITHOUT a status check" in effect["action"], effect
        assert f"runs settle {run_id} {REFUND} --applied" in effect["action"], effect
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "go")
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.call_counts(kind="refund") == {key: 2}  # declined, then applied


async def test_an_applied_answer_whose_journal_write_loses_its_fence_is_asked_again(
    harness: Harness,
) -> None:
    """The check answered "applied", then another worker took the run over before the
    answer was journaled: the write is refused by its fence (nothing of it lands), the
    new owner asks again and records it; refunded once, never called."""
    async with harness as h:
        run_id, key = await _refund_failed(h, LIE)
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "look")
        AFTER_CHECK.append(lambda: h.claim(run_id, "w-takeover"))
        await h.execute(run_id)
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert step.status == StepStatus.FAILED and "answer" not in step.input["recheck"]
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.effect_counts(kind="refund") == {key: 1}
        assert ledger.call_counts(kind="refund") == {key: 1}
        assert _checks(key) == 2
        rechecked = [e for e in await h.events(run_id) if e.type == "compensation.rechecked"]
        assert [e.data["answer"] for e in rechecked] == ["applied"]


#: Refunds of the two-charge booking the provider declines / answers 429 (once each).
DECLINE2: set[str] = set()
BUSY2: set[str] = set()


async def _refund2(name: str, ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
    if name in BUSY2:
        BUSY2.discard(name)
        ledger.record_call(ctx.idempotency_key, "refund")
        raise RateLimited("busy", retry_after=120)
    if name in DECLINE2:
        ledger.record_call(ctx.idempotency_key, "refund")
        raise BusinessError(f"{name}: declined by the provider")
    return dict(apply_refund(ctx, effect_id, amount, dedupe=False))


def _two_charges_app() -> App:
    """A booking that charges ``a`` then ``b`` (each refunded by its own refund, with a
    status check), then fails to confirm: the decision refunds ``b`` at 4, ``a`` at 5."""
    DECLINE2.clear()
    BUSY2.clear()
    charges = [("charge_a", "refund_a", 100), ("charge_b", "refund_b", 20)]
    return booking_app("recheck_two", charges, _refund2, status=_status, refund_status=_status)


async def test_a_run_parked_after_its_recheck_never_calls_the_failed_refund_again(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both refunds declined; resumed, ``b``'s is asked about (not applied), called again
    and declined again, then ``a``'s is asked about and answered 429: the run parks. The
    pass that takes it back finds ``b``'s mark spent: ``b`` is not called a third time
    (a failed compensation is called again only after a person resumes the run)."""
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    async with Harness(tmp_path, _two_charges_app(), url=store_url) as h:
        DECLINE2.update({"refund_a", "refund_b"})
        run_id = await h.submit("booking")
        assert (await h.drive(run_id)).status == RunStatus.NEEDS_HUMAN
        keys = {s.step_no: s.idempotency_key for s in await h.journal(run_id)}
        assert [s.name for s in await h.journal(run_id)][4:] == ["refund_b", "refund_a"]
        DECLINE2.discard("refund_a")
        BUSY2.add("refund_a")
        await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "retry")
        run = await h.drive(run_id)
        assert run.status == RunStatus.NEEDS_HUMAN, run
        assert ledger.call_counts(kind="refund") == {keys[5]: 2, keys[6]: 3}
        assert ledger.effect_counts(kind="refund") == {keys[6]: 1}
        assert _checks(str(keys[5])) == 1 and _checks(str(keys[6])) == 1
        assert h.passes >= 3  # the run parked on the 429 and was taken back
