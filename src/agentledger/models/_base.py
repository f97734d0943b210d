"""The model interface, shaped like real chat-completion providers.

A model takes the conversation (messages) and the tools it may call (JSON
schemas) and answers with one assistant message: text, tool calls, or a refusal,
plus usage in tokens and its cost. Every model implements :class:`Model`; the
engine never needs to know which one it talks to. The offline
:class:`~agentledger.models._scripted.ScriptedModel` is the embedded default;
:mod:`agentledger.models._openai` and :mod:`agentledger.models._anthropic` talk to real
providers through their official SDKs (extras ``agentledger[openai]`` and
``agentledger[anthropic]``), and :class:`~agentledger.models._fallback.FallbackModel`
chains them. :func:`agentledger.models._spec.model_from_string` builds any of them from a
string such as ``openai:gpt-4.1-mini``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class FinishReason(StrEnum):
    """Why a model stopped answering, in the same words for every provider."""

    STOP = "stop"  # a whole answer
    LENGTH = "length"  # cut at the most output tokens
    TOOL_CALLS = "tool_calls"  # it proposes calls
    CONTENT_FILTER = "content_filter"
    REFUSAL = "refusal"


class UsageSource(StrEnum):
    """Where an answer's usage comes from."""

    REPORTED = "reported"  # the provider counted it
    ESTIMATED = "estimated"  # the gateway counted what the provider left out
    SIMULATED = "simulated"  # no provider counted or billed it (the scripted model)
    NONE = "none"  # a failed attempt that provably cost nothing


@dataclass
class ToolCall:
    """One call the model proposes. ``arguments`` is the raw JSON text, as providers send it."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(id=data["id"], name=data["name"], arguments=data["arguments"])


@dataclass
class Message:
    """A chat message. ``role`` is system | user | assistant | tool."""

    role: str
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    refusal: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role}
        if self.content is not None:
            data["content"] = self.content
        if self.tool_calls:
            data["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        if self.refusal is not None:
            data["refusal"] = self.refusal
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        return cls(
            role=data["role"],
            content=data.get("content"),
            tool_calls=[ToolCall.from_dict(c) for c in data.get("tool_calls", [])],
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            refusal=data.get("refusal"),
        )


@dataclass
class ToolSchema:
    """What a model sees of a tool: name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class Usage:
    """Tokens a call consumed."""

    input_tokens: int = 0  # all prompt tokens, cached ones included
    output_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens read from the provider's cache

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class ModelRequest:
    """Everything a model call needs."""

    messages: list[Message]
    tools: list[ToolSchema]
    timeout: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Called with each text delta while a streaming model answers (a run event, not
    # journaled: the journal keeps only the final message).
    on_delta: Callable[[str], Awaitable[None] | None] | None = None


@dataclass
class ModelResponse:
    """One assistant turn. ``finish_reason`` is stop | tool_calls | refusal | length: a
    response exists only for an answer the provider said was finished."""

    message: Message
    usage: Usage
    cost_usd: float = 0.0
    model: str = ""
    finish_reason: str = FinishReason.STOP
    provider: str = ""
    latency_ms: float | None = None
    price_source: str | None = None  # e.g. "genai-prices 0.2.3", "override"
    #: Where ``usage`` comes from: "reported" by the provider, or "estimated" by the
    #: gateway for what the provider left out (an answer is never free).
    usage_source: str = UsageSource.REPORTED


class Model(ABC):
    """A chat model the agent loop can call.

    Implementations raise :class:`agentledger.errors.RateLimited`,
    :class:`~agentledger.errors.ProviderError` or
    :class:`~agentledger.errors.ToolTimeout` so the engine retries by class.
    """

    name: str = "model"

    @abstractmethod
    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one turn of the conversation."""
