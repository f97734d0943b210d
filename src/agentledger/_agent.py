"""Declaring an agent: model + instructions + tools + policy + budget, named and versioned."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentledger._budget import Budget
from agentledger._inputs import (
    AGENT_DEFAULT_SCHEMA,
    InputModel,
    check_declaration,
    input_schema,
    validate_agent_input,
)
from agentledger._policies import Policy
from agentledger.errors import UsageError
from agentledger.models._base import Model
from agentledger.models._spec import resolve_model
from agentledger.tools._contract import Tool


@dataclass
class Agent:
    """An agent definition. Runs record ``name`` and ``version``; a worker only
    resumes runs whose version it has loaded.

    >>> Agent(name="concierge", version="1", model=ScriptedModel(turns),
    ...       instructions="Book rooms.", tools=[search_hotels])
    >>> Agent(name="concierge", model="openai:gpt-4.1-mini", instructions="...")

    ``input_model`` (a pydantic model class or a JSON schema dict) declares the run
    input, checked at submit; without it an agent takes a string or an object with a
    string ``"message"``.
    """

    name: str
    model: Model
    instructions: str
    tools: list[Tool] = field(default_factory=list)
    version: str = "1"
    policy: Policy | None = None
    budget: Budget = field(default_factory=Budget)
    max_invalid_calls: int = 1  # invalid arguments fed back to the model this many times
    # Put what is remembered about the run's user (agentledger.memory) into the model's
    # context as a system message; add memory_tools() to let the agent remember more.
    memory: bool = False
    end_user_message: str = (
        "We could not finish this automatically; a member of our team will follow up."
    )
    input_model: InputModel = None
    # Where the service posts this agent's run events when a run names no webhook.
    webhook: str | None = None

    kind = "agent"

    def __post_init__(self) -> None:
        # A model may be named by a string ("openai:gpt-4.1-mini"); AGENTLEDGER_MODEL,
        # when set, replaces it (a real model by configuration alone).
        self.model = resolve_model(self.model)
        for i, t in enumerate(self.tools):
            if not isinstance(t, Tool):
                raise UsageError(
                    f"agent {self.name}: tools[{i}] is {t!r}, not a tool; pass the function "
                    "decorated with @app.tool or agentledger.tool, not its name"
                )
        check_declaration(self.input_model, f"agent {self.name}")

    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the input this agent accepts."""
        return input_schema(self.input_model) or AGENT_DEFAULT_SCHEMA

    def validate_input(self, value: Any) -> None:
        """Raise :class:`~agentledger._inputs.InvalidInput` when ``value`` does not fit."""
        validate_agent_input(value, self.input_model, f"{self.name}@{self.version}")

    def tool(self, name: str) -> Tool | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None
