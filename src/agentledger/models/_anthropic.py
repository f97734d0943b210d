"""Anthropic Messages through the official ``anthropic`` SDK (``agentledger[anthropic]``).

The SDK reads ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``. Mapping: system messages
become the ``system`` parameter; tools are ``input_schema`` tools; ``tool_use`` blocks
(parallel too) become tool calls with their input as JSON text; tool results are
``tool_result`` blocks in one user turn; ``stop_reason="refusal"`` is a refusal; an
answer with no text and no tool use is :class:`~agentledger.models._errors.InvalidResponse`.
A stream is read event by event: it is an answer only once ``message_delta`` gave its
``stop_reason`` and ``message_stop`` came; a stream that ends or breaks off before, or
a stop reason that does not say the answer is whole (``pause_turn``, an unknown one), is
:class:`~agentledger.models._errors.IncompleteAnswer`; tool use cut by ``max_tokens`` is
never run. Usage the provider leaves out is
counted by the gateway's estimate (:meth:`ProviderModel.counted`).
"""

from __future__ import annotations

import json
from typing import Any

from agentledger.errors import ToolError
from agentledger.models._base import (
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
)
from agentledger.models._errors import IncompleteAnswer, InvalidResponse
from agentledger.models._provider import ProviderModel, broke_off, finished, import_sdk

#: The stop reasons that say an answer is whole, as ours (``pause_turn`` asks the caller
#: to continue the turn: not whole).
STOP_REASONS = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "tool_use": FinishReason.TOOL_CALLS,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "refusal": FinishReason.REFUSAL,
}


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
        return self.sdk().AsyncAnthropic(**self.client_options())

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
            answer = await client.messages.create(**params)
            texts, calls = _blocks(answer.content or [])
            return self._response(
                request,
                texts,
                calls,
                answer.stop_reason or "end_turn",  # a whole body: finished (as for OpenAI)
                _usage(answer),
                answer.model,
            )
        return await self._send_streaming(request, params)

    async def _send_streaming(self, request: ModelRequest, params: dict[str, Any]) -> ModelResponse:
        """Read the raw events: the SDK's accumulator would hand back a partial message as
        final when the stream ends early, and fails on events without usage."""
        stream = await self.client().messages.create(**params, stream=True)
        blocks: dict[int, dict[str, Any]] = {}
        usage: dict[str, Any] = {}
        stop_reason: str | None = None
        stopped = False
        model = self.model
        broke: str | None = None
        chars = 0
        try:
            async with stream:
                async for event in stream:
                    kind = getattr(event, "type", None)
                    if kind == "message_start":
                        model = getattr(event.message, "model", None) or model
                        # Its output count is a placeholder: only message_delta's is the answer's.
                        usage.update(_usage(event.message))
                        usage.pop("output_tokens", None)
                    elif kind == "content_block_start":
                        block = event.content_block
                        blocks[event.index] = {
                            "type": block.type,
                            "text": getattr(block, "text", "") or "",
                            "id": getattr(block, "id", ""),
                            "name": getattr(block, "name", ""),
                            "json": "",
                        }
                    elif kind == "content_block_delta":
                        slot = blocks.setdefault(
                            event.index, {"type": "text", "text": "", "json": ""}
                        )
                        delta = event.delta
                        chars += len(getattr(delta, "text", None) or "")
                        chars += len(getattr(delta, "partial_json", None) or "")
                        self.overlong(chars)
                        if delta.type == "text_delta":
                            slot["text"] += delta.text
                            if request.on_delta is not None:
                                maybe = request.on_delta(delta.text)
                                if maybe is not None:
                                    await maybe
                        elif delta.type == "input_json_delta":
                            slot["json"] += delta.partial_json
                    elif kind == "message_delta":
                        stop_reason = getattr(event.delta, "stop_reason", None) or stop_reason
                        usage.update(_usage(event))
                    elif kind == "message_stop":
                        stopped = True
        except Exception as exc:
            broke = broke_off(self.sdk(), exc)
            if broke is None:
                raise
        if not stopped or stop_reason is None:  # the provider never said it was finished
            chars = sum(len(b["text"]) + len(b["json"]) for b in blocks.values())
            raise IncompleteAnswer(
                f"{self.name}: the stream {broke or 'ended'} without "
                f"{'a stop reason' if stop_reason is None else 'message_stop'} after "
                f"{chars} characters: not an answer"
            )
        texts: list[str] = []
        calls: list[ToolCall] = []
        for i in sorted(blocks):
            block = blocks[i]
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use":
                arguments = _json_text(block["json"])
                calls.append(ToolCall(id=block["id"], name=block["name"], arguments=arguments))
        return self._response(request, texts, calls, stop_reason, usage, model)

    def _response(
        self,
        request: ModelRequest,
        texts: list[str],
        calls: list[ToolCall],
        stop_reason: str | None,
        usage: dict[str, Any],
        model: str | None,
    ) -> ModelResponse:
        cached = usage.get("cache_read_input_tokens") or 0
        written = usage.get("cache_creation_input_tokens") or 0
        tokens_in = usage.get("input_tokens")
        if isinstance(tokens_in, int) and isinstance(cached, int) and isinstance(written, int):
            tokens_in += cached + written  # Anthropic counts cache reads and writes apart
        counts = (tokens_in, usage.get("output_tokens"), cached, written)
        text = "".join(texts) or None
        try:
            reason = finished(self.name, stop_reason, STOP_REASONS, bool(calls))
            if reason == FinishReason.REFUSAL:
                message = Message("assistant", refusal=text or "refused")
            elif calls:
                message, reason = (
                    Message("assistant", content=text, tool_calls=calls),
                    FinishReason.TOOL_CALLS,
                )
            elif not text or not text.strip():
                raise InvalidResponse(f"{self.name}: empty answer (stop_reason={stop_reason})")
            else:
                message = Message("assistant", content=text)
        except ToolError as exc:
            sent = Message("assistant", content=text, tool_calls=calls)
            raise self.reported(exc, request, sent, *counts) from None
        counted, cost, source = self.counted(request, message, *counts)
        return ModelResponse(
            message=message,
            usage=counted,
            cost_usd=cost,
            model=model or self.model,
            finish_reason=reason,
            provider=self.provider,
            price_source=self.pricer.source,
            usage_source=source,
        )


def _blocks(content: Any) -> tuple[list[str], list[ToolCall]]:
    """The text and tool calls of a whole answer's content blocks."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append(ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input)))
    return texts, calls


def _usage(holder: Any) -> dict[str, Any]:
    """The usage counts an answer or event carries (none when it has no usage)."""
    usage = getattr(holder, "usage", None)
    if usage is None:
        return {}
    names = (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    )
    return {n: v for n in names if (v := getattr(usage, n, None)) is not None}


def _json_text(text: str) -> str:
    """A streamed tool input as JSON text (``{}`` for none; malformed text kept as sent,
    so the tool step feeds it back to the model as invalid arguments)."""
    if not text.strip():
        return "{}"
    try:
        return json.dumps(json.loads(text))
    except ValueError:
        return text
