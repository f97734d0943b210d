"""Regression tests from attacking the step protocols on purpose: each reproduces a
way a run could call a write it should not, lose an outbox drop, end terminal with a
write in flight, or loop on a value no store can hold."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

from agentledger import App, RunStatus, Status, ToolContext
from agentledger.engine._tool_step import run_tool_step
from agentledger.errors import RateLimited
from agentledger.records import StepStatus
from agentledger.tools._contract import Compensation, tool
from tests.fast.lifecycle_harness import KILLED, Harness, Killed
from tests.fast.writes_harness import Fault, Provider, World, make_tool, world

__all__ = ["world"]


class Pay:
    def __init__(self) -> None:
        self.charges: dict[str, Any] = {}
        self.calls: list[tuple[str, float]] = []
        self.faults: list[str] = []
        self.refunds: list[str] = []
        self.status_answer: Any = None
        self.hang = asyncio.Event()
        self.refund_faults: list[str] = []


def pay_app(p: Pay, h_clock: Any = None) -> App:
    app = App("attacks")

    async def status(ctx: ToolContext, args: dict[str, Any]) -> Any:
        if p.status_answer is not None:
            return p.status_answer
        done = p.charges.get(ctx.idempotency_key)
        return Status.succeeded(done) if done else Status.not_found()

    @app.tool(effect="money", idempotency="provider")
    async def refund(ctx: ToolContext, payment_id: str) -> dict[str, Any]:
        if p.refund_faults:
            p.refund_faults.pop(0)
            raise RateLimited("slow down", retry_after=60)
        p.refunds.append(payment_id)
        return {"refunded": payment_id}

    @app.tool(
        effect="money",
        idempotency="provider",
        status_check=status,
        compensation=Compensation("refund", lambda a, r: {"payment_id": r["payment_id"]}),
    )
    async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
        p.calls.append((ctx.idempotency_key, ctx.clock.now()))
        fault = p.faults.pop(0) if p.faults else "ok"
        if fault == "429":
            raise RateLimited("slow down", retry_after=60)
        result = {"payment_id": f"pay_{amount}"}
        p.charges[ctx.idempotency_key] = result
        if fault == "hang":
            await p.hang.wait()  # applied, and no answer
        if fault == "kill":
            raise Killed()
        return result

    @app.tool(effect="read")
    async def lookup(ctx: ToolContext) -> dict[str, Any]:
        p.calls.append(("lookup", ctx.clock.now()))
        return {"n": 2**70}

    @app.workflow(name="pay")
    async def pay(ctx: Any, input: Any) -> Any:
        await ctx.tool("charge", amount=40)
        return "paid"

    @app.workflow(name="pay_with_timeout")
    async def pay_with_timeout(ctx: Any, input: Any) -> Any:
        # Workflow code that gives up on a slow call itself (and swallows the timeout).
        try:
            await asyncio.wait_for(ctx.tool("charge", amount=40), 0.05)
        except TimeoutError:
            return "gave up waiting"
        return "paid"

    @app.workflow(name="pay_then_fail")
    async def pay_then_fail(ctx: Any, input: Any) -> Any:
        await ctx.tool("charge", amount=40)
        raise RuntimeError("no room after all")

    @app.workflow(name="look")
    async def look(ctx: Any, input: Any) -> Any:
        return await ctx.tool("lookup")

    return app


# -- a crash between a backoff's journal entry and the park ---------------------------


async def test_a_kill_right_after_a_backoff_is_journaled_still_honours_retry_after(
    tmp_path: Path,
) -> None:
    """The ``retrying`` entry and the run's ``waiting`` state commit together: a worker
    killed right after the entry does not leave the run to be resumed (and the provider
    called again) before its Retry-After."""
    p = Pay()
    p.faults = ["429"]
    async with Harness(tmp_path, pay_app(p)) as h:
        original = h.store.commit

        async def die_after_retrying(batch: Any) -> None:
            await original(batch)
            if any(s.status == StepStatus.RETRYING for s in batch.steps):
                raise Killed()

        h.store.commit = die_after_retrying  # type: ignore[method-assign]
        run_id = await h.submit("pay")
        assert await h.execute(run_id) == KILLED
        h.store.commit = original  # type: ignore[method-assign]
        run = await h.run(run_id)
        assert run.status == RunStatus.WAITING and run.available_at is not None
        h.clock.advance(run.available_at - h.clock.now())  # the run is due, not before
        run = await h.drive(run_id)
    assert run.status == RunStatus.COMPLETED
    (first, t0), (second, t1) = p.calls
    assert first == second and t1 - t0 >= 60


# -- cancel while a write is parked for a backoff ---------------------------------------


async def test_a_cancel_while_a_write_waits_out_a_backoff_does_not_call_it(
    tmp_path: Path,
) -> None:
    """The parked write provably applied nothing (429): the cancel is honoured before
    calling again, not after charging and refunding."""
    p = Pay()
    p.faults = ["429"]
    async with Harness(tmp_path, pay_app(p)) as h:
        run_id = await h.submit("pay")
        assert await h.execute(run_id) == RunStatus.WAITING
        h.cancels[run_id] = "guest cancelled"
        assert await h.execute(run_id) == RunStatus.CANCELLED
        journal = await h.journal(run_id)
    assert len(p.calls) == 1 and p.charges == {} and p.refunds == []
    (step,) = journal
    assert step.status == StepStatus.FAILED and "cancelled" in (step.error or "")


# -- hostile status check answers --------------------------------------------------------


async def test_a_status_check_answering_garbage_is_could_not_ask(tmp_path: Path) -> None:
    """A status check that returns something other than a Status is "could not ask"
    (pending), never an exception escaping with the write journaled ``started``."""
    p = Pay()
    p.faults = ["kill"]
    p.status_answer = {"state": "succeeded"}  # a dict, not a Status
    async with Harness(tmp_path, pay_app(p)) as h:
        run_id = await h.submit("pay")
        assert await h.execute(run_id) == KILLED
        run = await h.drive(run_id)
        journal = await h.journal(run_id)
    assert run.status == RunStatus.NEEDS_HUMAN, run
    assert "unknown" in (run.handover_reason or "") or "pending" in (run.handover_reason or "")
    assert len(p.calls) == 1
    assert journal[0].status in (StepStatus.UNKNOWN, StepStatus.STARTED)


async def test_a_run_never_ends_terminal_with_a_write_in_flight(tmp_path: Path) -> None:
    """Workflow code that abandons a tool call itself (asyncio.wait_for) and returns:
    the charge was applied and its step is still ``started``; the run goes to a human,
    never ``completed`` with an unsettled write."""
    p = Pay()
    p.faults = ["hang"]
    async with Harness(tmp_path, pay_app(p)) as h:
        run_id = await h.submit("pay_with_timeout")
        assert await h.execute(run_id) == RunStatus.NEEDS_HUMAN
        run = await h.run(run_id)
        journal = await h.journal(run_id)
    assert journal[0].status == StepStatus.STARTED
    assert "charge" in (run.handover_reason or "") and "in flight" in (run.handover_reason or "")


# -- values no store can hold ------------------------------------------------------------


async def test_a_result_past_64_bits_round_trips(tmp_path: Path) -> None:
    """Not a bug (kept as a guard): JSON carries integers of any size, and the journal
    gives back exactly the value the first pass returned."""
    p = Pay()
    async with Harness(tmp_path, pay_app(p)) as h:
        run_id = await h.submit("look")
        assert await h.execute(run_id) == RunStatus.COMPLETED
        run = await h.run(run_id)
    assert run.result == {"n": 2**70} and len(p.calls) == 1


async def test_model_arguments_json_cannot_carry_are_invalid(world: World) -> None:
    """``NaN`` / ``Infinity`` in a model's JSON arguments (Python's json accepts them)
    never reach the journal, whose JSON columns cannot hold them on PostgreSQL: the
    model is told ``invalid_arguments``."""
    measured: list[float] = []

    async def measure(ctx: ToolContext, value: float) -> Any:
        measured.append(value)
        return value

    world.add(tool(measure, effect="write", idempotency="provider"))
    exe = await world.new_execution()
    for n, raw in enumerate(['{"value": NaN}', '{"value": -Infinity}'], start=1):
        outcome = await run_tool_step(exe, n, "measure", raw)
        assert not outcome.ok and outcome.error_class == "invalid_arguments", outcome
        json.dumps((await world.step(exe.run.id, n)).input, allow_nan=False)  # storable
    outcome = await run_tool_step(exe, 3, "measure", {"value": float("nan")})
    assert not outcome.ok and outcome.error_class == "invalid_arguments", outcome
    assert measured == []


# -- an outbox row dropped while it is being delivered -------------------------------------


async def test_an_outbox_row_dropped_mid_delivery_is_not_resurrected(world: World) -> None:
    """The dispatcher's claim expired while its call was answered 429; meanwhile the
    run began compensating and dropped the row. The dispatcher's "retry later" must
    not bring the row back to ``pending`` (it would be sent after all)."""
    mailer = Provider(keyed=True)
    mail = make_tool(mailer, "mail", effect="notify", delivery="outbox")
    world.add(mail)
    exe = await world.new_execution()
    assert (await run_tool_step(exe, 1, "mail", {"item": "confirmed"})).ok
    (row,) = await world.outbox()

    async def drop_meanwhile(ctx: ToolContext, item: str = "x") -> Any:
        with sqlite3.connect(world.path) as conn:  # the dispatcher's lease ran out
            conn.execute("UPDATE outbox SET lease_expires_at = 0")
        from agentledger.engine._steps import new_step

        decision = new_step(exe, 2, "decision", "compensate", status=StepStatus.SUCCEEDED)
        decision.output = {"status": "cancelled", "plan": []}
        await exe.record(decision, drop_outbox=True)
        raise RateLimited("slow down", retry_after=1)

    mail.fn = drop_meanwhile
    await world.dispatcher().drain()
    (row,) = await world.outbox()
    assert row.status == "dropped", row
    mail.fn = lambda ctx, item="x": mailer.call(ctx, {"item": item})  # type: ignore[assignment]
    await world.make_due()
    await world.dispatcher().drain()
    assert mailer.effects == []


__all__ += ["Fault"]


# -- a cancel arriving while the run compensates ------------------------------------------


async def test_a_cancel_while_a_refund_waits_out_a_backoff_still_refunds(tmp_path: Path) -> None:
    """The run already decided (failed) and is compensating: a cancel changes nothing;
    the parked refund is made, and the run ends as decided."""
    p = Pay()
    p.refund_faults = ["429"]
    async with Harness(tmp_path, pay_app(p)) as h:
        run_id = await h.submit("pay_then_fail")
        assert await h.execute(run_id) == RunStatus.WAITING
        h.cancels[run_id] = "guest cancelled"
        run = await h.drive(run_id)
    assert run.status == RunStatus.FAILED and p.refunds == ["pay_40"]


# -- hostile Retry-After values -----------------------------------------------------------


def test_hostile_retry_after_values_are_never_a_negative_nan_or_endless_wait() -> None:
    from agentledger.engine._retries import backoff
    from agentledger.tools._contract import RetryPolicy
    from agentledger.tools._http import retry_after_seconds

    policy = RetryPolicy()
    for text in (
        "-1",
        "nan",
        "1e400",
        "inf",
        "Wed, 21 Oct 2015 07:28:00 GMT",
        "Mon",
        " ",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "99999999999999999999999",
    ):
        delay = backoff(policy, 1, retry_after_seconds(text))
        assert delay is None or 0 < delay <= policy.max_retry_after, (text, delay)
