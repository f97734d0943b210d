"""agentledger's side of the kill -> resume workload: the same traced step as the others.

Workers load it with ``--app agentledger_anchors.al_app:app``.
"""

from __future__ import annotations

from typing import Any

from agentledger._app import App
from agentledger._budget import Budget
from agentledger.engine._workflow_runner import WorkflowContext
from agentledger_anchors.ticks import TICKS, tick

app = App("agentledger-anchors")


async def anchors_ticks(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """``TICKS`` traced steps of 5 ms of work each."""
    for i in range(TICKS):
        await ctx.step("tick", tick, input["path"], i)
    return {"ticks": TICKS}


# The default step budget would hand a long run over to a human.
app.workflow(
    anchors_ticks,
    budget=Budget(
        max_steps=10**7, active_seconds=24 * 3600, max_tokens=10**12, max_spend_usd=10**9
    ),
)
