"""OpenAI Chat Completions through the official ``openai`` SDK (``agentledger[openai]``).

Works with OpenAI itself and any compatible server (vLLM, Ollama, llama.cpp's server,
a LiteLLM proxy): ``openai-compatible:MODEL@BASE_URL``. The SDK reads
``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``; a compatible server that needs no key gets
a placeholder one.

Mapping: tools are ``function`` tools; the assistant's ``tool_calls`` (parallel too)
come back with their raw ``arguments`` text -- malformed JSON included, which the tool
step then treats as invalid arguments and feeds back to the model; tool results are
``tool`` messages; ``message.refusal`` is a refusal; ``finish_reason="content_filter"``
is :class:`~agentledger.errors.Refused`; an answer with no text, no call and no refusal
is :class:`~agentledger.models._errors.InvalidResponse`. A stream that ends with no
``finish_reason`` (the connection closed early, no ``[DONE]``), or with one that does not
say the answer is whole (``error``, ``abort``), is
:class:`~agentledger.models._errors.IncompleteAnswer`, never an answer; only the first
choice is read; tool calls cut by ``length`` are never run; a missing
``usage`` is counted by the gateway's estimate (:meth:`ProviderModel.counted`).
"""

from __future__ import annotations

import os
from typing import Any

from agentledger.errors import Refused, ToolError
from agentledger.models._base import (
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
)
from agentledger.models._errors import IncompleteAnswer, InvalidResponse
from agentledger.models._provider import (
    ProviderModel,
    broke_off,
    finished,
    import_sdk,
    safe_url,
)


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our conversation as Chat Completions messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""})
        elif m.role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.refusal is not None and m.content is None:
                item["content"] = m.refusal
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in m.tool_calls
                ]
            out.append(item)
        else:
            out.append({"role": m.role, "content": m.content or ""})
    return out


def to_openai_tools(request: ModelRequest) -> list[dict[str, Any]]:
    """Tool schemas as ``function`` tools."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in request.tools
    ]


#: The finish reasons that say an answer is whole, as ours.
FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
}


def finish(
    content: str | None, calls: list[ToolCall], refusal: str | None, reason: str | None, name: str
) -> tuple[Message, str]:
    """The assistant message and our finish reason, or the failure class of a bad answer
    (an answer that is not whole: :func:`~agentledger.models._provider.finished`)."""
    ours = finished(name, reason, FINISH_REASONS, bool(calls))
    if ours == FinishReason.CONTENT_FILTER:
        raise Refused(f"{name}: the provider's content filter blocked the answer")
    if refusal:
        return Message("assistant", content=None, refusal=refusal), FinishReason.REFUSAL
    if calls:
        message = Message("assistant", content=content or None, tool_calls=calls)
        return message, FinishReason.TOOL_CALLS
    if not content or not content.strip():
        raise InvalidResponse(f"{name}: empty answer (finish_reason={reason})")
    return Message("assistant", content=content), ours


def _sent(content: Any, calls: list[ToolCall], refusal: Any) -> Message:
    """What the provider sent for an answer that is not one (to weigh its usage)."""
    text = content if isinstance(content, str) else None
    return Message("assistant", content=text, tool_calls=calls, refusal=refusal or None)


def _counts(usage: Any) -> tuple[Any, Any, Any]:
    """Prompt, completion and cached tokens as reported (None where left out)."""
    details = getattr(usage, "prompt_tokens_details", None)
    return (
        getattr(usage, "prompt_tokens", None),
        getattr(usage, "completion_tokens", None),
        getattr(details, "cached_tokens", 0),
    )


class OpenAIModel(ProviderModel):
    """A Chat Completions model: ``OpenAIModel("gpt-4.1-mini")``."""

    provider = "openai"
    extra = "openai"

    def sdk(self) -> Any:
        return import_sdk("openai", self.extra)

    def make_client(self) -> Any:
        sdk = self.sdk()
        options = self.client_options()
        local = self.provider == "openai-compatible" and not os.environ.get("OPENAI_API_KEY")
        if local and "api_key" not in options:
            options["api_key"] = "not-needed"  # local servers take any key
        return sdk.AsyncOpenAI(**options)

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(request.messages),
            "max_completion_tokens": self.max_tokens,
        }
        if request.tools:
            params["tools"] = to_openai_tools(request)
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if request.timeout is not None:
            params["timeout"] = request.timeout
        return params

    async def send(self, request: ModelRequest) -> ModelResponse:
        params = self._params(request)
        if self.stream:
            return await self._send_streaming(request, params)
        completion = await self.client().chat.completions.create(**params)
        if not completion.choices:
            raise InvalidResponse(f"{self.name}: an answer with no choices")
        choice = completion.choices[0]
        msg = choice.message
        calls = [
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
            for c in (msg.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        try:
            # A whole (non-streamed) body is finished even when a compatible server leaves
            # its finish reason null; a reason it does give must be one we know.
            reason = choice.finish_reason or FinishReason.STOP
            message, reason = finish(
                msg.content, calls, getattr(msg, "refusal", None), reason, self.name
            )
        except ToolError as exc:
            sent = _sent(msg.content, calls, getattr(msg, "refusal", None))
            raise self.reported(exc, request, sent, *_counts(completion.usage)) from None
        return self._response(request, message, reason, completion.usage, completion.model)

    async def _send_streaming(self, request: ModelRequest, params: dict[str, Any]) -> ModelResponse:
        params = {**params, "stream": True, "stream_options": {"include_usage": True}}
        stream = await self.client().chat.completions.create(**params)
        text: list[str] = []
        refusal: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        reason: str | None = None
        usage: Any = None
        model = self.model
        broke: str | None = None
        chars = 0
        try:
            async with stream:  # closed on every way out (the connection freed)
                async for chunk in stream:
                    usage = chunk.usage or usage
                    model = chunk.model or model
                    for choice in chunk.choices or []:  # a usage chunk may have none, or null
                        if choice.index != 0:  # n=1 is asked for: another choice is not the answer
                            continue
                        reason = choice.finish_reason or reason
                        delta = choice.delta
                        if delta is None:  # a finishing choice may carry no delta at all
                            continue
                        chars += len(delta.content or "") + len(getattr(delta, "refusal", "") or "")
                        chars += sum(
                            len(c.function.arguments or "")
                            for c in delta.tool_calls or []
                            if c.function
                        )
                        self.overlong(chars)
                        if delta.content:
                            text.append(delta.content)
                            if request.on_delta is not None:
                                maybe = request.on_delta(delta.content)
                                if maybe is not None:
                                    await maybe
                        if getattr(delta, "refusal", None):
                            refusal.append(delta.refusal)
                        for c in delta.tool_calls or []:
                            slot = calls.setdefault(
                                c.index, {"id": "", "name": "", "arguments": ""}
                            )
                            slot["id"] = c.id or slot["id"]
                            if c.function is not None:
                                slot["name"] += c.function.name or ""
                                slot["arguments"] += c.function.arguments or ""
        except Exception as exc:
            # Broken off after the provider said the answer was finished: it is whole (the
            # usage chunk may be lost with [DONE]: then the estimate counts it).
            broke = broke_off(self.sdk(), exc)
            if broke is None:
                raise
        if reason is None:  # the provider never said the answer was finished
            raise IncompleteAnswer(
                f"{self.name}: the stream {broke or 'ended'} without a finish reason after "
                f"{sum(len(t) for t in text)} characters: not an answer"
            )  # (no usage: OpenAI sends it only after the finish)
        tool_calls = [ToolCall(**calls[i]) for i in sorted(calls)]
        content, refused = "".join(text) or None, "".join(refusal) or None
        try:
            message, reason = finish(content, tool_calls, refused, reason, self.name)
        except ToolError as exc:
            sent = _sent(content, tool_calls, refused)
            raise self.reported(exc, request, sent, *_counts(usage)) from None
        return self._response(request, message, reason, usage, model)

    def _response(
        self, request: ModelRequest, message: Message, reason: str, usage: Any, model: str
    ) -> ModelResponse:
        counted, cost, source = self.counted(request, message, *_counts(usage))
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


class OpenAICompatibleModel(OpenAIModel):
    """Any server speaking Chat Completions: ``openai-compatible:MODEL@BASE_URL``."""

    provider = "openai-compatible"

    def __init__(self, model: str, *, base_url: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("label", f"openai-compatible:{model}@{safe_url(base_url)}")
        super().__init__(model, base_url=base_url, **kwargs)

    def price_provider(self) -> str | None:
        return None  # a self-hosted model: priced by override, or by model name if known
