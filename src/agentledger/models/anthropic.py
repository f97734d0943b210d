"""Anthropic Messages through the official ``anthropic`` SDK (``agentledger[anthropic]``).

The SDK reads ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``. Mapping: system messages
become the ``system`` parameter; tools are ``input_schema`` tools; ``tool_use`` blocks
(parallel too) become tool calls with their input as JSON text; tool results are
``tool_result`` blocks in one user turn; ``stop_reason="refusal"`` is a refusal; an
answer with no text and no tool use is :class:`~agentledger.models.errors.InvalidResponse`.
"""

from __future__ import annotations

import json
from typing import Any

from agentledger.models.base import Message, ModelRequest, ModelResponse, ToolCall, Usage
from agentledger.models.errors import InvalidResponse
from agentledger.models.provider import ProviderModel, import_sdk


def _tool_input(arguments: str) -> dict[str, Any]:
    """A journaled call's arguments as a ``tool_use`` input (which must be an object)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_unparsed_arguments": arguments}
    return value if isinstance(value, dict) else {"_arguments": value}


def to_anthropic(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Our conversation as (system, messages): roles alternate, tool results in user turns."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system":
            system.append(m.content or "")
        elif m.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id,
                "content": m.content or "",
            }
            add("user", [block])
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = []
            text = m.content if m.content is not None else m.refusal
            if text:
                blocks.append({"type": "text", "text": text})
            for c in m.tool_calls:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": c.id,
                        "name": c.name,
                        "input": _tool_input(c.arguments),
                    }
                )
            add("assistant", blocks or [{"type": "text", "text": ""}])
        else:
            add("user", [{"type": "text", "text": m.content or ""}])
    return "\n\n".join(system), out


class AnthropicModel(ProviderModel):
    """A Messages API model: ``AnthropicModel("claude-sonnet-4-5")``."""

    provider = "anthropic"
    extra = "anthropic"

    def sdk(self) -> Any:
        return import_sdk("anthropic", self.extra)

    def make_client(self) -> Any:
        kwargs: dict[str, Any] = {"max_retries": 0, "timeout": self.timeout}
        if self.base_url:
            kwargs["base_url"] = self.base_url
        if self._api_key:
            kwargs["api_key"] = self._api_key
        return self.sdk().AsyncAnthropic(**kwargs)

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = to_anthropic(request.messages)
        params: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
        }
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if request.timeout is not None:
            params["timeout"] = request.timeout
        return params

    async def send(self, request: ModelRequest) -> ModelResponse:
        params = self._params(request)
        client = self.client()
        if not self.stream:
            return self._response(await client.messages.create(**params))
        async with client.messages.stream(**params) as stream:
            async for text in stream.text_stream:
                if request.on_delta is not None:
                    maybe = request.on_delta(text)
                    if maybe is not None:
                        await maybe
            final = await stream.get_final_message()
        return self._response(final)

    def _response(self, answer: Any) -> ModelResponse:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in answer.content or []:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append(
                    ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input))
                )
        text = "".join(texts) or None
        if answer.stop_reason == "refusal":
            message, reason = Message("assistant", refusal=text or "refused"), "refusal"
        elif calls:
            message, reason = Message("assistant", content=text, tool_calls=calls), "tool_calls"
        elif not text or not text.strip():
            raise InvalidResponse(f"{self.name}: empty answer (stop_reason={answer.stop_reason})")
        else:
            reason = "length" if answer.stop_reason == "max_tokens" else "stop"
            message = Message("assistant", content=text)
        usage = answer.usage
        cached = int(getattr(usage, "cache_read_input_tokens", 0) or 0)
        written = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
        tokens_in = int(usage.input_tokens or 0) + cached + written
        tokens_out = int(usage.output_tokens or 0)
        return ModelResponse(
            message=message,
            usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out, cached_tokens=cached),
            cost_usd=self.pricer.cost(tokens_in, tokens_out, cached, written),
            model=answer.model or self.model,
            finish_reason=reason,
            provider=self.provider,
            price_source=self.pricer.source,
        )
