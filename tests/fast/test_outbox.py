"""Outbox deliveries follow the write protocol: keyed, retried by class, status-checked
when unknown, effects-table guarded, with their run's context (in process, seconds)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from agentledger._outbox import BASE_DELAY_ENV, UNKNOWN_OUTCOME, default_base_delay
from agentledger.engine import _inflight as inflight
from agentledger.engine._tool_step import run_tool_step
from agentledger.errors import UsageError
from agentledger.records import Effect, OutboxItem
from tests.fast.writes_harness import Fault, Provider, World, make_tool, world

__all__ = ["world"]


async def _enqueue(w: World, tool: str, **run_fields: Any) -> str:
    exe = await w.new_execution(**run_fields)
    outcome = await run_tool_step(exe, 1, tool, {"item": "hello"})
    assert outcome.ok and outcome.result["queued"] is True
    return str(outcome.result["outbox_key"])


def _email(provider: Provider, **options: Any) -> Any:
    options.setdefault("effect", "notify")
    options.setdefault("delivery", "outbox")
    return make_tool(provider, "email", **options)


async def test_a_delivery_carries_its_runs_tenant_user_and_input(world: World) -> None:
    mail = Provider()
    world.add(_email(mail))
    key = await _enqueue(world, "email", tenant_id="acme", user_id="guest-7", input={"b": 1})
    row = await world.deliver_until_settled()
    assert row.status == "delivered" and row.key == key
    (ctx,) = mail.contexts
    assert (ctx.tenant_id, ctx.user_id, ctx.run_input) == ("acme", "guest-7", {"b": 1})
    assert ctx.idempotency_key == key


async def test_a_row_that_is_not_pending_is_never_delivered(world: World) -> None:
    mail = Provider()
    world.add(_email(mail))
    await _enqueue(world, "email")
    (row,) = await world.outbox()
    for status in ("dropped", "delivered", "dead"):
        row.status = status
        assert await world.dispatcher().deliver(row) is None
    assert mail.calls == []


async def test_a_row_already_in_flight_in_this_process_is_not_called_again(
    world: World,
) -> None:
    mail = Provider()
    world.add(_email(mail))
    key = await _enqueue(world, "email")
    (row,) = await world.outbox()
    async with inflight.exclusive(("outbox", key)):
        assert await world.dispatcher().deliver(row) is None
    assert mail.calls == []


async def test_a_timed_out_delivery_is_resolved_by_the_status_check(world: World) -> None:
    """Item 7.3: the outbox no longer retries blindly."""
    mail = Provider().fail("timeout_after")
    world.add(_email(mail))
    await _enqueue(world, "email")
    row = await world.deliver_until_settled()
    assert row.status == "delivered"
    assert len(mail.calls) == 1 and mail.checks == 1 and len(mail.effects) == 1


async def test_a_keyless_delivery_that_timed_out_is_dead_never_sent_twice(world: World) -> None:
    mail = Provider(keyed=False).fail("timeout_after")
    world.add(_email(mail, idempotency="effects", checked=False))
    key = await _enqueue(world, "email")
    row = await world.deliver_until_settled()
    assert row.status == "dead" and UNKNOWN_OUTCOME in (row.last_error or "")
    assert len(mail.calls) == 1 and len(mail.effects) == 1
    effect = await world.store.get_effect(key)
    assert effect is not None and effect.status == "claimed"  # no result: a human checks
    assert row.history and row.history[-1]["dead"] is True


async def test_a_keyless_delivery_claimed_by_a_dead_dispatcher_is_not_called(
    world: World,
) -> None:
    """A dispatcher died mid-call: the claim has no result; the row is never re-sent."""
    mail = Provider(keyed=False)
    world.add(_email(mail, idempotency="effects", checked=False))
    key = await _enqueue(world, "email")
    (row,) = await world.outbox()
    await world.store.swap_effect(Effect(key, row.run_id, row.step_no, "claimed"), None)
    row = await world.deliver_until_settled()
    assert row.status == "dead" and UNKNOWN_OUTCOME in (row.last_error or "")
    assert mail.calls == []


async def test_a_keyless_delivery_claimed_with_a_status_check_is_checked(world: World) -> None:
    mail = Provider(keyed=False)
    world.add(_email(mail, idempotency="effects"))
    key = await _enqueue(world, "email")
    (row,) = await world.outbox()
    await world.store.swap_effect(Effect(key, row.run_id, row.step_no, "claimed"), None)
    row = await world.deliver_until_settled()  # not found -> claimed again, sent once
    assert row.status == "delivered" and len(mail.calls) == 1 and mail.checks == 1
    effect = await world.store.get_effect(key)
    assert effect is not None and effect.status == "done"


async def test_a_delivery_whose_effect_is_done_is_not_sent(world: World) -> None:
    mail = Provider(keyed=False)
    world.add(_email(mail, idempotency="effects", checked=False))
    key = await _enqueue(world, "email")
    (row,) = await world.outbox()
    await world.store.swap_effect(Effect(key, row.run_id, row.step_no, "done", {"id": 1}), None)
    row = await world.deliver_until_settled()
    assert row.status == "delivered" and mail.calls == []


async def test_a_keyless_delivery_answered_429_releases_its_claim_and_retries(
    world: World,
) -> None:
    mail = Provider(keyed=False).fail(Fault("429", retry_after=30.0))
    world.add(_email(mail, idempotency="effects", checked=False))
    key = await _enqueue(world, "email")
    dispatcher = world.dispatcher()
    await dispatcher.drain()
    (row,) = await world.outbox()
    assert row.status == "pending" and row.next_attempt_at == pytest.approx(
        world.clock.now() + 30.0
    )
    effect = await world.store.get_effect(key)
    assert effect is not None and effect.status == "failed"  # released: nothing applied
    row = await world.deliver_until_settled()
    assert row.status == "delivered" and len(mail.calls) == 2 and len(mail.effects) == 1
    effect = await world.store.get_effect(key)
    assert effect is not None and effect.status == "done"


async def test_a_business_answer_is_a_dead_letter_at_once_with_its_history(
    world: World,
) -> None:
    mail = Provider().fail("business")
    world.add(_email(mail))
    await _enqueue(world, "email")
    row = await world.deliver_until_settled()
    assert row.status == "dead" and "business_error" in (row.last_error or "")
    assert len(mail.calls) == 1 and row.attempts == 1


async def test_what_exhausts_its_attempts_is_a_dead_letter_with_its_history(
    world: World,
) -> None:
    mail = Provider().fail(*["5xx_before"] * 10)
    world.add(_email(mail, outbox_attempts=3))
    await _enqueue(world, "email")
    row = await world.deliver_until_settled()
    assert row.status == "dead" and len(mail.calls) == 3 and mail.effects == []
    assert mail.checks == 3  # each 5xx was checked: the failure is proven
    assert [h["attempt"] for h in row.history if "retry_in" in h] == [1, 2]


async def test_a_keyed_delivery_without_check_5xx_every_time_ends_unknown(world: World) -> None:
    mail = Provider().fail("5xx_saved")  # applied; the saved 500 is replayed for the key
    world.add(_email(mail, checked=False, outbox_attempts=3))
    await _enqueue(world, "email")
    row = await world.deliver_until_settled()
    assert row.status == "dead" and UNKNOWN_OUTCOME in (row.last_error or "")
    assert len(mail.effects) == 1 and len(mail.calls) == 3


async def test_in_progress_is_waited_for_and_checked_never_dead(world: World) -> None:
    """Issue 12 bug 2: a 409 "request in progress" is the same request running."""
    mail = Provider().fail(Fault("in_progress", apply=True))
    mail.status_faults = ["pending"]
    world.add(_email(mail))
    await _enqueue(world, "email")
    dispatcher = world.dispatcher()
    await dispatcher.drain()
    (row,) = await world.outbox()
    assert row.status == "pending" and "in_progress" in (row.last_error or "")
    row = await world.deliver_until_settled()
    assert row.status == "delivered" and len(mail.calls) == 1 and len(mail.effects) == 1
    assert mail.checks == 2


@pytest.mark.parametrize("retry_after", [math.inf, 10_000.0])
async def test_an_uncapped_retry_after_is_a_dead_letter_not_a_forever_wait(
    world: World, retry_after: float
) -> None:
    mail = Provider().fail(Fault("429", retry_after=retry_after))
    world.add(_email(mail))
    await _enqueue(world, "email")
    row = await world.deliver_until_settled()
    assert row.status == "dead" and "rate_limited" in (row.last_error or "")
    assert math.isfinite(row.next_attempt_at)


async def test_a_row_of_an_unknown_tool_is_dead(world: World) -> None:
    mail = Provider()
    world.add(_email(mail))
    await _enqueue(world, "email")
    world.app.tools.pop("email")
    row = await world.deliver_until_settled()
    assert row.status == "dead" and "no tool" in (row.last_error or "")


async def test_the_dispatcher_loop_delivers_and_stops(world: World) -> None:
    mail = Provider()
    world.add(_email(mail))
    await _enqueue(world, "email")
    stopping = asyncio.Event()
    task = asyncio.create_task(world.dispatcher(poll=0.01).run(stopping))
    for _ in range(500):
        rows: list[OutboxItem] = await world.outbox()
        if rows[0].status == "delivered":
            break
        await asyncio.sleep(0.01)
    stopping.set()
    await task
    assert len(mail.calls) == 1


def test_the_outbox_backoff_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's dispatcher reads its first backoff from the environment (the slow
    provider tests use a short one); nonsense is refused, never a zero or NaN delay."""
    monkeypatch.delenv(BASE_DELAY_ENV, raising=False)
    assert default_base_delay() == 1.0
    monkeypatch.setenv(BASE_DELAY_ENV, "0.02")
    assert default_base_delay() == 0.02
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv(BASE_DELAY_ENV, bad)
        with pytest.raises(UsageError):
            default_base_delay()
