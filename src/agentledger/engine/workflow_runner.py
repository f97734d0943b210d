"""Workflows: plain async functions whose ``ctx.step`` / ``ctx.tool`` calls are
journaled by call order, exactly like an agent's steps."""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

from agentledger.engine.execution import Execution
from agentledger.engine.signals import Park
from agentledger.engine.tool_step import close_duration, new_step, run_tool_step
from agentledger.errors import (
    BusinessError,
    InvalidArguments,
    ProviderError,
    RateLimited,
    Refused,
    ToolError,
    ToolTimeout,
)
from agentledger.records import StepStatus
from agentledger.tools.contract import Tool
from agentledger.workflow import Workflow

_ERRORS: dict[str, type[ToolError]] = {
    "business_error": BusinessError,
    "refused": Refused,
    "not_allowed": Refused,
    "invalid_arguments": InvalidArguments,
    "rate_limited": RateLimited,
    "provider_error": ProviderError,
    "timeout": ToolTimeout,
}


class StepFailed(ToolError):
    """A journaled ``ctx.step`` raised; replays raise it again with the same message."""

    error_class = "step_failed"


class WorkflowContext:
    """What a workflow function receives: journaled steps, tools and sleeps."""

    def __init__(self, exe: Execution) -> None:
        self._exe = exe
        self._next = 1

    @property
    def run_id(self) -> str:
        return self._exe.run.id

    @property
    def input(self) -> Any:
        return self._exe.run.input

    @property
    def user_id(self) -> str | None:
        return self._exe.run.user_id

    def _take_step_no(self) -> int:
        step_no, self._next = self._next, self._next + 1
        return step_no

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once; on replay return its journaled result."""
        step_no = self._take_step_no()
        exe = self._exe
        prior = exe.prior(step_no, name)
        if prior is not None and prior.status == StepStatus.SUCCEEDED:
            return prior.output
        if prior is not None and prior.status == StepStatus.FAILED:
            raise StepFailed(prior.error or "step failed")
        exe.between_steps()
        step = new_step(exe, step_no, "step", name, status="")
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            json.dumps(result)
        except Exception as exc:
            step.status, step.error_class, step.error = (
                StepStatus.FAILED,
                type(exc).__name__,
                str(exc),
            )
            close_duration(step)
            await exe.record(step)
            raise
        step.status, step.output, step.attempts = StepStatus.SUCCEEDED, result, 1
        close_duration(step)
        await exe.record(step)
        return result

    async def tool(self, tool: str | Tool, /, **arguments: Any) -> Any:
        """Call a registered tool under its contract; raise its failure class on failure.

        The idempotency key is ``run_id:step_no:name:hash(arguments)``.
        """
        name = tool if isinstance(tool, str) else tool.name
        step_no = self._take_step_no()
        exe = self._exe
        prior = exe.journal.get(step_no)
        if prior is None or prior.status not in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            exe.between_steps()
        digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, default=str).encode())
        key = f"{exe.key(step_no)}:{name}:{digest.hexdigest()[:12]}"
        outcome = await run_tool_step(exe, step_no, name, arguments, key=key)
        if outcome.ok:
            return outcome.result
        raise _ERRORS.get(outcome.error_class or "", ToolError)(outcome.error or "tool failed")

    async def sleep(self, seconds: float) -> None:
        """A durable sleep: the run parks and no worker is held while it waits."""
        step_no = self._take_step_no()
        exe = self._exe
        prior = exe.journal.get(step_no)
        if prior is not None and prior.status == StepStatus.SUCCEEDED:
            return
        if prior is None:
            exe.between_steps()
            step = new_step(exe, step_no, "sleep", "sleep", status=StepStatus.STARTED)
            step.output = {"until": time.time() + seconds}
            await exe.record(step)
        else:
            step = prior
        until = float(step.output["until"])
        if time.time() < until:
            raise Park(until, f"sleeping until {until:.0f}")
        step.status = StepStatus.SUCCEEDED
        close_duration(step)
        await exe.record(step)


async def run_workflow(exe: Execution, workflow: Workflow) -> Any:
    """Run (or replay) a workflow function to its result."""
    ctx = WorkflowContext(exe)
    return await workflow.fn(ctx, exe.run.input)
