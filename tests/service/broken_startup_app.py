"""An App whose startup hook fails: the inline worker of ``serve`` stops at once."""

from __future__ import annotations

from typing import Any

from agentledger import App, WorkflowContext

app = App("broken-startup")


@app.on_startup
async def _connect(app: App) -> None:
    raise ConnectionRefusedError("the CRM client could not connect to crm.internal:443")


@app.workflow(name="noop", version="1")
async def noop(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """Never runs: the worker does not start."""
    return {}
