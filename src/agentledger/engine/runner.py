"""Execute one claimed run to its next resting state.

The outcome is one of: completed, failed, needs_human (handover), waiting
(parked), or abandoned/released (no write: the lease is gone or the worker is
stopping). Compensations run before a run is failed or handed over for a budget.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agentledger.agent import Agent
from agentledger.app import App
from agentledger.engine.agent_loop import run_agent
from agentledger.engine.compensation import compensate
from agentledger.engine.execution import Execution
from agentledger.engine.signals import Abandon, Handover, Park, RunFailed
from agentledger.engine.workflow_runner import run_workflow
from agentledger.records import Run, RunStatus
from agentledger.store.base import NewEvent, Store

log = logging.getLogger(__name__)

RELEASED = "released"
ABANDONED = "abandoned"


async def execute_run(
    store: Store,
    app: App,
    run: Run,
    owner: str,
    *,
    stopping: asyncio.Event | None = None,
    park_threshold: float = 2.0,
    max_resumes: int = 50,
) -> str:
    """Run ``run`` (claimed by ``owner``) until it rests; return where it ended.

    A run that keeps losing its worker (``max_resumes`` lease takeovers: a crash
    loop, a step that kills its process) is handed to a human instead of being
    resumed forever.
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
    )
    try:
        await exe.load()
        if run.resumes > max_resumes:
            detail = f"resumed {run.resumes} times after losing its worker; stopped to look"
            await exe.finish(
                RunStatus.NEEDS_HUMAN,
                error=definition.end_user_message,
                handover_reason=detail,
                events=[NewEvent("run.handover", owner, {"reason": "resumes", "detail": detail})],
            )
            return RunStatus.NEEDS_HUMAN
        return await _drive(exe, definition)
    except Abandon as abandon:
        log.info("run %s abandoned: %s", run.id, abandon.why)
        return RELEASED if abandon.release else ABANDONED


async def _drive(exe: Execution, definition: Any) -> str:
    try:
        if isinstance(definition, Agent):
            result = await run_agent(exe, definition)
        else:
            result = await run_workflow(exe, definition)
    except Park as park:
        if park.committed:
            return RunStatus.WAITING
        await exe.finish(
            RunStatus.WAITING,
            available_at=park.available_at,
            events=[
                NewEvent("run.parked", exe.owner, {"why": park.why, "until": park.available_at})
            ],
        )
        return RunStatus.WAITING
    except Handover as handover:
        if handover.reason != "unknown_outcome":
            # An unknown outcome is left exactly as it is for a human to resolve.
            await _compensate(exe)
        await exe.finish(
            RunStatus.NEEDS_HUMAN,
            error=definition.end_user_message,
            handover_reason=handover.detail,
            events=[
                NewEvent(
                    "run.handover",
                    exe.owner,
                    {"reason": handover.reason, "detail": handover.detail},
                )
            ],
        )
        return RunStatus.NEEDS_HUMAN
    except RunFailed as failed:
        await _compensate(exe)
        await exe.finish(
            RunStatus.FAILED,
            error=failed.message,
            handover_reason=failed.error_class,
            events=[NewEvent("run.failed", exe.owner, {"error": failed.message})],
        )
        return RunStatus.FAILED
    except Exception as exc:  # the workflow raised: the run fails, its effects are undone
        await _compensate(exe)
        message = f"{type(exc).__name__}: {exc}"
        await exe.finish(
            RunStatus.FAILED,
            error=message,
            events=[NewEvent("run.failed", exe.owner, {"error": message})],
        )
        return RunStatus.FAILED
    await exe.finish(
        RunStatus.COMPLETED,
        result=result,
        events=[NewEvent("run.completed", exe.owner, {"steps": exe.step_count})],
    )
    return RunStatus.COMPLETED


async def _compensate(exe: Execution) -> None:
    try:
        await compensate(exe)
    except (Park, Handover) as stuck:
        log.warning("compensation of run %s incomplete: %s", exe.run.id, stuck)
        await exe.event("compensation.incomplete", {"detail": str(stuck)})
