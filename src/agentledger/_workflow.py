"""Declaring a workflow: a plain async function whose steps are journaled.

    @app.workflow(version="1")
    async def nightly_report(ctx: WorkflowContext, input: dict) -> dict:
        rows = await ctx.step("load", load_rows, input["day"])
        await ctx.tool("send_email", to="ops@example.com", body=render(rows))
        return {"rows": len(rows)}

On resume the function runs again from the top; every ``ctx.step`` /
``ctx.tool`` the journal records as succeeded returns its stored output instead
of running, so the code must call steps in the same order each time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentledger._budget import Budget
from agentledger._inputs import InputModel, check_declaration, input_schema, validate_input
from agentledger._policies import Policy

WorkflowFn = Callable[..., Awaitable[Any]]


@dataclass
class Workflow:
    """A workflow definition (name, version, function, budget, policy, input).

    ``input_model`` (a pydantic model class or a JSON schema dict) declares the run
    input, checked at submit; without it any JSON value is accepted.
    """

    name: str
    fn: WorkflowFn
    version: str = "1"
    budget: Budget = field(
        default_factory=lambda: Budget(
            max_steps=1000, active_seconds=3600, max_tokens=10**9, max_spend_usd=10**6
        )
    )
    policy: Policy | None = None
    end_user_message: str = (
        "We could not finish this automatically; a member of our team will follow up."
    )
    input_model: InputModel = None
    # Where the service posts this workflow's run events when a run names no webhook.
    webhook: str | None = None

    kind = "workflow"

    def __post_init__(self) -> None:
        check_declaration(self.input_model, f"workflow {self.name}")

    def input_schema(self) -> dict[str, Any] | None:
        """The JSON schema of the declared input (None: any JSON value)."""
        return input_schema(self.input_model)

    def validate_input(self, value: Any) -> None:
        """Raise :class:`~agentledger._inputs.InvalidInput` when ``value`` does not fit."""
        validate_input(value, self.input_model, f"{self.name}@{self.version}")
