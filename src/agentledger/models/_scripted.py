"""An offline, deterministic model that drives tools the way an LLM would.

A script is either a list of :class:`Turn` (turn *n* answers the *n*-th model
call of the run) or a function of the request that returns the next turn. The
turn index comes from the conversation itself (the number of assistant messages
so far), so a resumed run asks for the same turn it would have asked for.

Misbehaviour is scriptable because real models misbehave::

    ScriptedModel.looping("search_hotels", {"city": "Lisbon"})   # never stops
    Turn(calls=[("create_booking", "{not json")])                 # malformed arguments
    Turn(calls=[("teleport", {})])                                # unknown tool
    Turn(calls=[("create_payment", {"booking_id": "b1", "amount": 1})])  # sets a server arg
    Turn(refusal="I can't help with that.")                       # refusal
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentledger.models._base import (
    FinishReason,
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
    UsageSource,
)


@dataclass
class Turn:
    """One scripted assistant turn: text, tool calls (name, args dict or raw JSON), or refusal."""

    text: str | None = None
    calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    refusal: str | None = None


Script = Sequence[Turn] | Callable[[ModelRequest], Turn]


def count_tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: about four characters a token."""
    return max(1, len(text) // 4)


class ScriptedModel(Model):
    """The embedded default model: no network, same answer every time."""

    def __init__(
        self,
        script: Script,
        *,
        name: str = "scripted",
        usd_per_1k_input: float = 0.0005,
        usd_per_1k_output: float = 0.0015,
        latency: float = 0.0,
    ) -> None:
        self.script = script
        self.name = name
        self.usd_per_1k_input = usd_per_1k_input
        self.usd_per_1k_output = usd_per_1k_output
        self.latency = latency

    @classmethod
    def looping(cls, tool: str, args: dict[str, Any], **kwargs: Any) -> ScriptedModel:
        """A model that calls the same tool forever (for budget tests)."""
        return cls(lambda request: Turn(calls=[(tool, args)]), **kwargs)

    def next_turn(self, request: ModelRequest) -> Turn:
        if callable(self.script):
            return self.script(request)
        index = sum(1 for m in request.messages if m.role == "assistant")
        if index < len(self.script):
            return self.script[index]
        return Turn(text="Done.")

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if self.latency:
            await asyncio.sleep(self.latency)
        turn = self.next_turn(request)
        index = sum(1 for m in request.messages if m.role == "assistant")
        calls = [
            ToolCall(
                id=f"call_{index}_{j}",
                name=name,
                arguments=args if isinstance(args, str) else json.dumps(args, sort_keys=True),
            )
            for j, (name, args) in enumerate(turn.calls)
        ]
        message = Message(
            role="assistant", content=turn.text, tool_calls=calls, refusal=turn.refusal
        )
        prompt = sum(count_tokens(json.dumps(m.to_dict())) for m in request.messages)
        prompt += sum(count_tokens(json.dumps(t.parameters)) for t in request.tools)
        output = count_tokens(json.dumps(message.to_dict()))
        cost = prompt / 1000 * self.usd_per_1k_input + output / 1000 * self.usd_per_1k_output
        if turn.refusal is not None:
            finish = FinishReason.REFUSAL
        elif calls:
            finish = FinishReason.TOOL_CALLS
        else:
            finish = FinishReason.STOP
        return ModelResponse(
            message=message,
            usage=Usage(input_tokens=prompt, output_tokens=output),
            cost_usd=round(cost, 8),
            model=self.name,
            finish_reason=finish,
            # No provider counted or billed this: the figures are the scripted model's own
            # estimate, marked simulated wherever they are shown.
            usage_source=UsageSource.SIMULATED,
            price_source="scripted model (simulated)",
        )
