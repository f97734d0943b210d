"""Direct writes and their unknown outcomes, in process on a FakeClock (seconds)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from agentledger.engine._signals import Abandon, Handover, Park
from agentledger.engine._tool_step import run_tool_step
from agentledger.engine._unknown import drive_write
from agentledger.records import Step, StepStatus
from agentledger.tools._contract import RetryPolicy
from tests.fast.writes_harness import Fault, Provider, World, make_tool, world

__all__ = ["world"]


async def _step(w: World, tool: str, *, item: str = "x", step_no: int = 1) -> tuple[Any, Any]:
    exe = await w.new_execution()
    outcome = await run_tool_step(exe, step_no, tool, {"item": item})
    return exe, outcome


# a 5xx answer to a write is an unknown outcome (issue 12, engine bug 1) ---------------


async def test_a_500_after_commit_is_resolved_by_the_status_check(world: World) -> None:
    """Stripe: the charge applied, the 500 is saved and replayed for the key. The
    status check with the same key finds the charge; the step succeeds."""
    pay = Provider().fail("5xx_saved")
    world.add(make_tool(pay, "pay"))
    exe, outcome = await _step(world, "pay")
    assert outcome.ok and outcome.result == pay.applied[f"{exe.run.id}:1"]
    assert len(pay.effects) == 1 and pay.calls == [f"{exe.run.id}:1"] and pay.checks == 1
    step = await world.step(exe.run.id, 1)
    assert step.status == StepStatus.SUCCEEDED
    events = await world.events(exe.run.id)
    assert "tool.unknown_outcome" in events and "tool.status_resolved" in events


async def test_a_keyed_write_without_status_check_answered_5xx_is_never_a_failure(
    world: World,
) -> None:
    """No status check: resend with the same key a bounded number of times, then a
    human -- never a recorded failure that may have been applied."""
    pay = Provider().fail("5xx_saved")
    world.add(make_tool(pay, "pay", checked=False))
    exe = await world.new_execution()
    with pytest.raises(Handover) as handover:
        await run_tool_step(exe, 1, "pay", {"item": "x"})
    assert handover.value.reason == "unknown_outcome"
    assert len(pay.effects) == 1 and len(pay.calls) == 4  # 1 + 3 same-key resends
    assert set(pay.calls) == {f"{exe.run.id}:1"}
    step = await world.step(exe.run.id, 1)
    assert step.status == StepStatus.UNKNOWN and step.error_class == "provider_error"


async def test_a_keyed_write_without_status_check_resent_after_5xx_succeeds(
    world: World,
) -> None:
    pay = Provider().fail("5xx_after")  # applied, answered 500; the resend replays it
    world.add(make_tool(pay, "pay", checked=False))
    _exe, outcome = await _step(world, "pay")
    assert outcome.ok and len(pay.effects) == 1 and len(pay.calls) == 2


async def test_a_5xx_before_applying_is_checked_then_resent(world: World) -> None:
    pay = Provider().fail("5xx_before")
    world.add(make_tool(pay, "pay"))
    _exe, outcome = await _step(world, "pay")
    assert outcome.ok and pay.checks == 1 and len(pay.calls) == 2 and len(pay.effects) == 1


async def test_5xx_on_every_call_fails_only_once_checks_prove_nothing_applied(
    world: World,
) -> None:
    pay = Provider().fail("5xx_before", "5xx_before", "5xx_before")
    world.add(make_tool(pay, "pay"))
    _exe, outcome = await _step(world, "pay")
    assert not outcome.ok and outcome.error_class == "provider_error"
    assert len(pay.calls) == 3 and pay.checks == 3 and pay.effects == []


async def test_a_keyless_write_answered_5xx_goes_to_a_human_after_one_call(
    world: World,
) -> None:
    mail = Provider(keyed=False).fail("5xx_after")
    world.add(make_tool(mail, "mail", idempotency="effects", checked=False))
    exe = await world.new_execution()
    with pytest.raises(Handover) as handover:
        await run_tool_step(exe, 1, "mail", {"item": "x"})
    assert "no status check" in handover.value.detail
    assert len(mail.calls) == 1
    effect = await world.store.get_effect(f"{exe.run.id}:1")
    assert effect is not None and effect.status == "claimed"  # no result: a human looks


async def test_a_connection_refused_is_provably_not_sent_and_resent(world: World) -> None:
    mail = Provider(keyed=False).fail("not_sent")
    world.add(make_tool(mail, "mail", idempotency="effects", checked=False))
    exe, outcome = await _step(world, "mail")
    assert outcome.ok and len(mail.calls) == 2 and len(mail.effects) == 1
    effect = await world.store.get_effect(f"{exe.run.id}:1")
    assert effect is not None and effect.status == "done"


async def test_not_sent_every_time_fails_and_releases_the_claim(world: World) -> None:
    mail = Provider(keyed=False).fail("not_sent", "not_sent", "not_sent")
    world.add(make_tool(mail, "mail", idempotency="effects", checked=False))
    exe, outcome = await _step(world, "mail")
    assert not outcome.ok and outcome.error_class == "provider_error" and mail.effects == []
    effect = await world.store.get_effect(f"{exe.run.id}:1")
    assert effect is not None and effect.status == "failed"


# 409 request in progress (issue 12, engine bug 2) --------------------------------------


async def test_in_progress_waits_then_checks_with_the_same_key(world: World) -> None:
    refund = Provider().fail(Fault("in_progress", apply=True))
    world.add(make_tool(refund, "refund"))
    exe, outcome = await _step(world, "refund")
    assert outcome.ok and len(refund.calls) == 1 and refund.checks == 1
    assert len(refund.effects) == 1 and world.clock.slept  # it waited before checking
    step = await world.step(exe.run.id, 1)
    assert step.status == StepStatus.SUCCEEDED


async def test_in_progress_without_status_check_resends_the_same_key(world: World) -> None:
    refund = Provider().fail(Fault("in_progress"), Fault("in_progress"))
    world.add(make_tool(refund, "refund", checked=False))
    _exe, outcome = await _step(world, "refund")
    assert outcome.ok and len(refund.calls) == 3 and len(refund.effects) == 1
    assert len(world.clock.slept) == 2


async def test_in_progress_for_too_long_is_handed_over_never_failed(world: World) -> None:
    refund = Provider().fail(*[Fault("in_progress")] * 10)
    world.add(make_tool(refund, "refund", checked=False, retry=RetryPolicy(base_delay=0.01)))
    exe = await world.new_execution()
    with pytest.raises(Handover) as handover:
        await run_tool_step(exe, 1, "refund", {"item": "x"})
    assert "in progress" in handover.value.detail
    step = await world.step(exe.run.id, 1)
    assert step.status != StepStatus.FAILED


async def test_a_compensation_answered_in_progress_is_resolved_not_failed(world: World) -> None:
    refund = Provider().fail(Fault("in_progress", apply=True))
    world.add(make_tool(refund, "refund"))
    exe = await world.new_execution()
    outcome = await run_tool_step(exe, 1, "refund", {"item": "x"}, kind="compensation")
    assert outcome.ok and len(refund.effects) == 1
    assert (await world.step(exe.run.id, 1)).kind == "compensation"


# Retry-After is capped (issue 7 item 18) ------------------------------------------------


@pytest.mark.parametrize("retry_after", [math.inf, 1e12, 301.0])
async def test_a_retry_after_beyond_the_cap_is_the_classes_failure(
    world: World, retry_after: float
) -> None:
    pay = Provider().fail(Fault("429", retry_after=retry_after))
    world.add(make_tool(pay, "pay"))
    _exe, outcome = await _step(world, "pay")
    assert not outcome.ok and outcome.error_class == "rate_limited"
    assert len(pay.calls) == 1 and world.clock.slept == []


async def test_a_retry_after_within_the_cap_parks_the_run_until_then(world: World) -> None:
    pay = Provider().fail(Fault("429", retry_after=120.0))
    world.add(make_tool(pay, "pay"))
    exe = await world.new_execution()
    with pytest.raises(Park) as park:
        await run_tool_step(exe, 1, "pay", {"item": "x"})
    assert park.value.available_at == pytest.approx(world.clock.now() + 120.0)
    step = await world.step(exe.run.id, 1)
    assert step.status == StepStatus.RETRYING and step.error_class == "rate_limited"
    # Resumed later: ``started`` is journaled again before the next call.
    journaled: list[str] = []
    original = world.store.commit

    async def spy(batch: Any) -> None:
        journaled.extend(s.status for s in batch.steps)
        await original(batch)

    world.store.commit = spy  # type: ignore[method-assign]
    exe2 = await world.reclaim(exe.run.id)
    outcome = await run_tool_step(exe2, 1, "pay", {"item": "x"})
    assert outcome.ok and len(pay.effects) == 1
    assert journaled == [StepStatus.STARTED, StepStatus.SUCCEEDED]


async def test_a_short_retry_after_waits_in_the_worker(world: World) -> None:
    pay = Provider().fail(Fault("429", retry_after=1.5))
    world.add(make_tool(pay, "pay"))
    _exe, outcome = await _step(world, "pay")
    assert outcome.ok and world.clock.slept == [pytest.approx(1.5)]


# no time left: not called, not applied (issue 7 item 19) --------------------------------


async def test_a_write_with_no_time_left_is_a_deadline_failure_not_unknown(
    world: World,
) -> None:
    mail = Provider(keyed=False)
    world.add(make_tool(mail, "mail", idempotency="effects", checked=False))
    exe = await world.new_execution()
    world.clock.advance(exe.budget.active_seconds + 1)
    outcome = await run_tool_step(exe, 1, "mail", {"item": "x"})
    assert not outcome.ok and outcome.error_class == "deadline"
    assert mail.calls == []
    step = await world.step(exe.run.id, 1)
    assert step.status == StepStatus.FAILED and step.error_class == "deadline"
    effect = await world.store.get_effect(f"{exe.run.id}:1")
    assert effect is not None and effect.status == "failed"  # released: nothing applied


async def test_no_time_left_after_an_unknown_attempt_is_still_unknown(world: World) -> None:
    pay = Provider().fail("5xx_after")
    world.add(make_tool(pay, "pay", checked=False))
    exe = await world.new_execution()
    step = Step(exe.run.id, 1, "tool", "pay", StepStatus.RETRYING, input={"args": {"item": "x"}})
    step.output = {"retry": {"attempts": 1, "maybe_applied": True, "doubt": "provider_error"}}
    await exe.record(step)
    world.clock.advance(exe.budget.active_seconds + 1)
    with pytest.raises(Handover):
        await drive_write(exe, step, world.app.tools["pay"], {"item": "x"}, f"{exe.run.id}:1")
    assert pay.calls == []


# resume: a ``started`` write is never called blind ----------------------------------------


async def _started(w: World, tool: str) -> tuple[Any, Step]:
    exe = await w.new_execution()
    step = Step(exe.run.id, 1, "tool", tool, StepStatus.STARTED, input={"args": {"item": "x"}})
    step.idempotency_key = f"{exe.run.id}:1"
    await exe.record(step)
    return await w.reclaim(exe.run.id), step


async def test_a_started_write_is_status_checked_on_resume(world: World) -> None:
    pay = Provider()
    world.add(make_tool(pay, "pay"))
    exe, _ = await _started(world, "pay")
    pay.applied[f"{exe.run.id}:1"] = {"id": "fx_before_crash"}
    outcome = await run_tool_step(exe, 1, "pay", {"item": "x"})
    assert outcome.ok and outcome.result == {"id": "fx_before_crash"} and pay.calls == []
    assert "tool.resumed_unknown" in await world.events(exe.run.id)


async def test_a_status_check_pending_then_parks_then_resolves(world: World) -> None:
    pay = Provider()
    pay.status_faults = ["error", "pending", "pending"]
    world.add(make_tool(pay, "pay"))
    exe, _ = await _started(world, "pay")
    outcome = await run_tool_step(exe, 1, "pay", {"item": "x"})  # short waits in the worker
    assert outcome.ok and pay.checks == 4 and len(pay.calls) == 1  # not found -> sent


async def test_a_status_check_pending_for_ever_goes_to_a_human(world: World) -> None:
    pay = Provider()
    pay.status_faults = ["pending"] * 20
    world.add(make_tool(pay, "pay", retry=RetryPolicy(base_delay=0.01, max_delay=0.02)))
    exe, _ = await _started(world, "pay")
    with pytest.raises(Handover) as handover:
        await run_tool_step(exe, 1, "pay", {"item": "x"})
    assert "pending" in handover.value.detail and pay.calls == []


async def test_a_long_pending_wait_parks_the_run_as_unknown(world: World) -> None:
    pay = Provider()
    pay.status_faults = ["pending"]
    world.add(make_tool(pay, "pay", retry=RetryPolicy(base_delay=10.0)))
    exe, _ = await _started(world, "pay")
    with pytest.raises(Park):
        await run_tool_step(exe, 1, "pay", {"item": "x"})
    assert (await world.step(exe.run.id, 1)).status == StepStatus.UNKNOWN
    exe2 = await world.reclaim(exe.run.id)
    outcome = await run_tool_step(exe2, 1, "pay", {"item": "x"})
    assert outcome.ok and pay.checks == 2 and len(pay.calls) == 1


async def test_a_status_check_reporting_failed_is_the_failure_path(world: World) -> None:
    pay = Provider()
    pay.status_faults = ["failed"]
    world.add(make_tool(pay, "pay"))
    exe, _ = await _started(world, "pay")
    outcome = await run_tool_step(exe, 1, "pay", {"item": "x"})
    assert not outcome.ok and outcome.error_class == "business_error" and pay.calls == []


async def test_a_started_keyless_write_goes_to_a_human_without_a_call(world: World) -> None:
    mail = Provider(keyed=False)
    world.add(make_tool(mail, "mail", idempotency="effects", checked=False))
    exe = await world.new_execution()
    inner = mail.call

    async def die(ctx: Any, args: dict[str, Any]) -> Any:
        await inner(ctx, args)
        raise Killed  # the worker dies after the provider applied it

    mail.call = die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        await run_tool_step(exe, 1, "mail", {"item": "x"})
    exe2 = await world.reclaim(exe.run.id)
    with pytest.raises(Handover) as handover:
        await run_tool_step(exe2, 1, "mail", {"item": "x"})
    assert handover.value.reason == "unknown_outcome" and len(mail.calls) == 1


class Killed(BaseException):
    """The worker process died here."""


async def test_a_keyless_write_whose_effect_is_done_is_found_on_resume(world: World) -> None:
    from agentledger.records import Effect

    mail = Provider(keyed=False)
    world.add(make_tool(mail, "mail", idempotency="effects", checked=False))
    exe, _ = await _started(world, "mail")
    key = f"{exe.run.id}:1"
    await world.store.swap_effect(Effect(key, exe.run.id, 1, "done", {"id": "m1"}), None)
    outcome = await run_tool_step(exe, 1, "mail", {"item": "x"})
    assert outcome.ok and outcome.result == {"id": "m1"} and mail.calls == []


async def test_a_started_keyed_write_without_check_is_resent_with_its_key(world: World) -> None:
    pay = Provider()
    world.add(make_tool(pay, "pay", checked=False))
    exe, _ = await _started(world, "pay")
    outcome = await run_tool_step(exe, 1, "pay", {"item": "x"})
    assert outcome.ok and pay.calls == [f"{exe.run.id}:1"]


# final answers, timeouts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "error_class"),
    [("business", "business_error"), ("refused", "refused"), ("invalid", "invalid_arguments")],
)
async def test_an_answer_is_final(world: World, kind: str, error_class: str) -> None:
    pay = Provider().fail(kind)
    world.add(make_tool(pay, "pay"))
    _exe, outcome = await _step(world, "pay")
    assert not outcome.ok and outcome.error_class == error_class and len(pay.calls) == 1


async def test_a_timeout_after_applying_is_found_by_the_status_check(world: World) -> None:
    pay = Provider().fail("timeout_after")
    world.add(make_tool(pay, "pay"))
    _exe, outcome = await _step(world, "pay")
    assert outcome.ok and len(pay.calls) == 1 and len(pay.effects) == 1


async def test_timeouts_proven_not_applied_fail_after_bounded_resends(world: World) -> None:
    pay = Provider().fail(*["timeout_before"] * 10)
    world.add(make_tool(pay, "pay"))
    _exe, outcome = await _step(world, "pay")
    assert not outcome.ok and outcome.error_class == "timeout"
    assert len(pay.calls) == 4 and pay.effects == []


async def test_a_shared_effect_key_waits_for_the_winner(world: World) -> None:
    """Two runs, one effect key (one gift per guest): the second takes the first's result."""
    gift = Provider(keyed=False)
    t = make_tool(gift, "gift", idempotency="effects", checked=False)
    t.effect_key = lambda args, ctx: f"gift:{args['item']}"
    world.add(t)
    _, first = await _step(world, "gift", item="g1")
    exe2 = await world.new_execution()
    second = await run_tool_step(exe2, 1, "gift", {"item": "g1"})
    assert first.ok and second.ok and second.result == first.result and len(gift.calls) == 1


async def test_a_shared_effect_key_with_no_result_goes_to_a_human(world: World) -> None:
    from agentledger.records import Effect

    gift = Provider(keyed=False)
    t = make_tool(gift, "gift", idempotency="effects", checked=False)
    t.effect_key = lambda args, ctx: f"gift:{args['item']}"
    world.add(t)
    await world.store.swap_effect(Effect("gift:g1", "other-run", 3, "claimed"), None)
    exe = await world.new_execution()
    with pytest.raises(Handover):
        await run_tool_step(exe, 1, "gift", {"item": "g1"})
    assert gift.calls == []
    await world.store.swap_effect(Effect("gift:g2", "other-run", 4, "failed"), None)
    exe2 = await world.new_execution()
    outcome = await run_tool_step(exe2, 1, "gift", {"item": "g2"})
    assert not outcome.ok and gift.calls == []


# one attempt of a step at a time in one process (issue 7 item 14) --------------------------


async def test_two_executions_of_one_step_never_call_at_once(world: World) -> None:
    """The run is re-claimed (new epoch) while its first execution is inside the call:
    the second waits for the first, then resolves by status check -- one call in all."""
    gate = asyncio.Event()
    entered = asyncio.Event()
    pay = Provider()
    inner = pay.call

    attempts: list[str] = []

    async def slow(ctx: Any, args: dict[str, Any]) -> Any:
        attempts.append(ctx.idempotency_key)
        if not entered.is_set():
            entered.set()
            await gate.wait()
        return await inner(ctx, args)

    pay.call = slow  # type: ignore[method-assign]
    world.add(make_tool(pay, "pay", timeout=3600))
    exe1 = await world.new_execution()
    first = asyncio.create_task(run_tool_step(exe1, 1, "pay", {"item": "x"}))
    await entered.wait()
    exe2 = await world.reclaim(exe1.run.id)
    second = asyncio.create_task(run_tool_step(exe2, 1, "pay", {"item": "x"}))
    for _ in range(20):  # let the second entrant run as far as it can
        await asyncio.sleep(0)
    assert len(attempts) == 1 and not second.done()
    gate.set()
    with pytest.raises(Abandon):  # the stale execution's outcome write is fenced
        await first
    outcome = await second
    assert outcome.ok and len(attempts) == 1 and pay.checks == 1
