"""Execute one claimed run to its next resting state.

The outcome is one of: completed, failed, cancelled, needs_human (handover),
waiting (parked), or abandoned/released (no write: the lease is gone or the
worker is stopping).

A run that stops short of completing (it failed, was cancelled, or hit a budget)
first journals that decision, then runs its compensations as durable steps
(:mod:`agentledger.engine._compensation`), then finishes in the decided state. A
compensation that waits parks the run, and the resumed run goes straight back to
compensating; one that cannot be settled ends the run ``needs_human``.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from agentledger._agent import Agent
from agentledger._app import App
from agentledger._canonical import journal_value
from agentledger._clock import SYSTEM, Clock
from agentledger._extras import MissingFeature
from agentledger.engine import _hooks as hooks
from agentledger.engine._agent_loop import run_agent
from agentledger.engine._compensation import (
    CompensationDecision,
    compensate,
    journaled_decision,
    plan_compensation,
)
from agentledger.engine._execution import STORE_RETRY_SECONDS, Execution
from agentledger.engine._signals import (
    Abandon,
    Cancelled,
    Handover,
    HandoverReason,
    Park,
    RunFailed,
)
from agentledger.engine._workflow_runner import run_workflow
from agentledger.errors import StoreError, StoreUnavailable
from agentledger.records import TRACEBACK_START, Run, RunStatus
from agentledger.store._base import NewEvent
from agentledger.store._sqlstore import Store

log = logging.getLogger(__name__)


class Stopped(StrEnum):
    """How :func:`execute_run` ends when it leaves the run unfinished to others."""

    RELEASED = "released"  # given back: another worker picks it up at once
    ABANDONED = "abandoned"  # left to its lease's expiry (the lease was lost)


async def execute_run(
    store: Store,
    app: App,
    run: Run,
    owner: str,
    *,
    stopping: asyncio.Event | None = None,
    park_threshold: float = 2.0,
    max_resumes: int = 50,
    cancel_requests: Mapping[str, str] | None = None,
    clock: Clock = SYSTEM,
    store_retry_seconds: float = STORE_RETRY_SECONDS,
) -> str:
    """Run ``run`` (claimed by ``owner``) until it rests; return where it ended.

    A run that keeps losing its worker (``max_resumes`` lease takeovers: a crash
    loop, a step that kills its process) is handed to a human instead of being
    resumed forever. ``cancel_requests`` is the worker's live map of cancel requests
    (run id -> reason), honoured at the next step boundary; ``clock`` is the time
    the engine reads (a fake one in tests).

    A journal write the store refuses for a reason that is not the run's (disk full,
    I/O error, read-only, connection lost) is retried for ``store_retry_seconds``; then
    the store's error is raised (:class:`StoreUnavailable`): nothing past the journal
    was written, and the caller gives the run back (see ``worker.py``).

    A write that moves the run out of ``running`` (it ends or parks) also sets on
    ``run`` what it wrote to the run's row (status, counters, result, error, handover
    reason, when it is due), so that the caller can tell where it rests without reading
    it back.
    """
    definition = app.get(run.name, run.version)
    if definition is None:  # claimed by target, so this is a programming error
        raise RuntimeError(f"worker has no definition for {run.target}")
    exe = Execution(
        store,
        definition,
        run,
        owner,
        app.tools,
        app.resources,
        stopping=stopping,
        park_threshold=park_threshold,
        clock=clock,
        cancel_requests=cancel_requests,
        store_retry_seconds=store_retry_seconds,
    )
    async with hooks.run_span(store, run, run.kind):  # spans (hooks.py): a run's span
        outcome = await _execute(exe, definition, max_resumes)
        hooks.set_outcome(outcome)
        return outcome


async def _execute(exe: Execution, definition: Any, max_resumes: int) -> str:
    run = exe.run
    try:
        await exe.load()
        if run.resumes > max_resumes:
            detail = f"resumed {run.resumes} times after losing its worker; stopped to look"
            await _end(
                exe,
                RunStatus.NEEDS_HUMAN,
                "run.handover",
                {"reason": HandoverReason.RESUMES, "detail": detail},
                error=definition.end_user_message,
                handover_reason=detail,
            )
            return RunStatus.NEEDS_HUMAN
        return await _drive(exe, definition)
    except Abandon as abandon:
        if abandon.error is not None:
            raise abandon.error from None  # the store failed: the worker reports it
        # A held outcome goes in before the lease is given back (a lost lease refuses it:
        # the next owner's status check settles that call).
        await exe.settle_held()
        log.info("run %s abandoned: %s", run.id, abandon.why)
        return Stopped.RELEASED if abandon.release else Stopped.ABANDONED


async def _drive(exe: Execution, definition: Any) -> str:
    decision = journaled_decision(exe)
    if decision is None:  # not compensating yet: run the agent or workflow
        try:
            if isinstance(definition, Agent):
                result = await run_agent(exe, definition)
            else:
                result = await run_workflow(exe, definition)
            result = journal_value(result)
        except Park as park:
            return await _park(exe, park)
        except Handover as handover:
            if handover.reason == HandoverReason.UNKNOWN_OUTCOME:
                # An unknown outcome is left exactly as it is for a human to resolve.
                return await _hand_over(exe, definition, handover.reason, handover.detail)
            decision = CompensationDecision(
                RunStatus.NEEDS_HUMAN,
                error=definition.end_user_message,
                handover_reason=handover.detail,
                event="run.handover",
                data={"reason": handover.reason, "detail": handover.detail},
            )
        except Cancelled as cancelled:
            decision = CompensationDecision(
                RunStatus.CANCELLED,
                error=f"cancelled: {cancelled.reason}",
                event="run.cancelled",
                data={"reason": cancelled.reason},
            )
        except RunFailed as failed:
            decision = CompensationDecision(
                RunStatus.FAILED,
                error=failed.message,
                handover_reason=failed.error_class,
                data={"error": failed.message},
            )
        except StoreError as exc:
            # The database failed, not the run: leave it to be resumed.
            raise _store_abandon(exc) from None
        except MissingFeature:
            # This process lacks a feature the step needs (engine/_hooks.py), not the
            # run a way to go on: the worker gives it back untouched and stops.
            raise
        except Exception as exc:  # the workflow raised: the run fails, its effects are undone
            # The traceback is kept with the error: a bare "KeyError: 'day'" names no line.
            message = f"{type(exc).__name__}: {exc}"
            trace = "".join(traceback.format_exception(exc)).rstrip()
            if not trace.startswith(TRACEBACK_START[1:]):  # a cause raised elsewhere
                trace = TRACEBACK_START[1:] + trace
            decision = CompensationDecision(
                RunStatus.FAILED,
                error=f"{message}\n{trace}",  # records.error_parts splits them again
                data={"error": message, "traceback": trace},
            )
        else:
            stuck = in_flight(exe)
            if stuck is not None:
                return await _hand_over(exe, definition, HandoverReason.UNKNOWN_OUTCOME, stuck)
            await _end(exe, RunStatus.COMPLETED, "run.completed", _totals(exe), result=result)
            return RunStatus.COMPLETED
        stuck = in_flight(exe)
        if stuck is not None:  # never decide past a write nobody settled
            return await _hand_over(exe, definition, HandoverReason.UNKNOWN_OUTCOME, stuck)
        decision = await plan_compensation(exe, decision)
    try:
        await compensate(exe, decision)
    except Park as park:
        return await _park(exe, park)
    except Handover as handover:
        heading = decision.handover_reason or decision.error or decision.status
        detail = f"{handover.detail} (the run was heading to {decision.status}: {heading})"
        return await _hand_over(exe, definition, handover.reason, detail)
    except StoreError as exc:
        raise _store_abandon(exc) from None
    await _end(
        exe,
        decision.status,
        decision.event,
        {**decision.data, **_totals(exe)},
        error=decision.error,
        handover_reason=decision.handover_reason,
    )
    return decision.status


async def _end(
    exe: Execution,
    status: str,
    event: str,
    data: dict[str, Any],
    *,
    result: Any = None,
    error: str | None = None,
    handover_reason: str | None = None,
) -> None:
    """Finish the run in the terminal ``status`` with its ending ``event``, whose data
    also records the run as this write leaves it (``run``: status, error,
    handover_reason, the values written to the run's row). What is reported of the
    event later -- a webhook is built when the event is sealed, by then the run may
    have been resumed and ended again -- is read from there, not from the row. The
    result is not copied: only a completed run has one, and a completed run never
    changes again, so its row holds it for good (a result may be megabytes)."""
    ended = {"status": status, "error": error, "handover_reason": handover_reason}
    await exe.finish(
        status,
        result=result,
        error=error,
        handover_reason=handover_reason,
        events=[NewEvent(event, exe.owner, {**data, "run": ended})],
    )


def _store_abandon(exc: StoreError) -> Abandon:
    """Stop the run on a store error met outside a journal write (a read, an effect
    claim): given back at once when the store's host failed, else left to its lease."""
    unavailable = isinstance(exc, StoreUnavailable)
    return Abandon(f"store error: {exc}", release=unavailable, error=exc if unavailable else None)


def _totals(exe: Execution) -> dict[str, Any]:
    """What a run's ending event records of it for the audit trail: steps and spend."""
    return {"steps": exe.step_count, "tokens": exe.tokens, "cost_usd": exe.cost_usd}


def in_flight(exe: Execution) -> str | None:
    """Why the run cannot end yet, if a tool step in its journal is still in flight.

    Workflow code can walk away from a call (``asyncio.wait_for`` around ``ctx.tool``,
    a ``gather`` whose sibling failed) and still return or raise: a write left
    ``started`` or ``unknown`` may have been applied, so the run goes to a human
    instead of a terminal state that would hide it.
    """
    stuck = [step for step in exe.journal.values() if step.outcome_unknown()]
    if not stuck:
        return None
    step = min(stuck, key=lambda s: s.step_no)  # the first one, by the journal's order
    return (
        f"step {step.step_no} ({step.name}, key {step.idempotency_key}) is still in "
        "flight: its outcome is unknown; check with the provider, then resolve the run"
    )


async def _park(exe: Execution, park: Park) -> str:
    if not park.committed:
        await exe.finish(
            RunStatus.WAITING,
            available_at=park.available_at,
            events=[
                NewEvent("run.parked", exe.owner, {"why": park.why, "until": park.available_at})
            ],
        )
    return RunStatus.WAITING


async def _hand_over(exe: Execution, definition: Any, reason: HandoverReason, detail: str) -> str:
    await _end(
        exe,
        RunStatus.NEEDS_HUMAN,
        "run.handover",
        {"reason": reason, "detail": detail},
        error=definition.end_user_message,
        handover_reason=detail,
    )
    return RunStatus.NEEDS_HUMAN
