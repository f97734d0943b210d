"""Compensation: undo earlier effects when a run fails for good.

Each succeeded write step whose tool declares a compensation is undone, newest
first, by a journaled compensation step with its own key. A compensation that
already ran (found in the journal) is not run again.
"""

from __future__ import annotations

from agentledger.engine.execution import Execution
from agentledger.engine.tool_step import run_tool_step
from agentledger.records import StepStatus


async def compensate(exe: Execution) -> list[int]:
    """Run the compensations still owed; return the step numbers compensated."""
    done: dict[int, int] = {}
    for step in exe.journal.values():
        if step.kind == "compensation" and isinstance(step.input, dict):
            target = step.input.get("compensates")
            if isinstance(target, int):
                done[target] = step.step_no
    owed = []
    for step in sorted(exe.journal.values(), key=lambda s: s.step_no, reverse=True):
        tool = exe.tools.get(step.name)
        if (
            step.kind == "tool"
            and step.status == StepStatus.SUCCEEDED
            and tool is not None
            and tool.compensation is not None
            and step.idempotency_key is not None
        ):
            owed.append((step, tool.compensation))
    compensated: list[int] = []
    exe.compensating = True
    for step, comp in owed:
        step_no = done.get(step.step_no) or max(exe.journal, default=0) + 1
        existing = exe.journal.get(step_no)
        if existing is not None and existing.status in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            continue
        args = comp.arguments(
            step.input.get("args", {}) if isinstance(step.input, dict) else {}, step.output
        )
        outcome = await run_tool_step(
            exe, step_no, comp.tool, args, kind="compensation", compensates=step.step_no
        )
        await exe.event(
            "compensation.done" if outcome.ok else "compensation.failed",
            {
                "step_no": step.step_no,
                "tool": comp.tool,
                "by_step": step_no,
                "error": outcome.error,
            },
        )
        compensated.append(step.step_no)
    return compensated


__all__ = ["compensate"]
