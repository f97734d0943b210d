"""What the OpenAI and Anthropic models share: configuration, lazy SDK clients, the
mapping of SDK errors to failure classes, token estimates and prices.

The SDKs run with ``max_retries=0``: the engine is the only retry loop, so every
attempt is journaled and budget-checked (:mod:`agentledger.engine._model_step`). Keys
come from the SDKs' own environment variables (``OPENAI_API_KEY``,
``ANTHROPIC_API_KEY``) or ``api_key=``; they are never part of a model's name, its
journal entries or its error messages.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentledger._backoff import retry_after
from agentledger.errors import NotSent, ProviderError, RateLimited, ToolError, ToolTimeout
from agentledger.models._base import (
    FinishReason,
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    Usage,
    UsageSource,
)
from agentledger.models._errors import (
    ContextWindowExceeded,
    IncompleteAnswer,
    InvalidResponse,
    MissingExtra,
    ModelRejected,
)
from agentledger.models._pricing import Price, Pricer

DEFAULT_MAX_TOKENS = 1024
DEFAULT_TIMEOUT = 60.0
#: Phrases providers use for "the prompt does not fit".
_CONTEXT_HINTS = (
    "context_length_exceeded",
    "maximum context length",
    "context window",
    "prompt is too long",
    "too many tokens",
)


def import_sdk(module: str, extra: str) -> Any:
    """Import a provider SDK, or fail with the one line that says what to install."""
    try:
        return __import__(module)
    except ImportError:
        raise MissingExtra(
            f"the {module} SDK is not installed: pip install 'agentledger[{extra}]'"
        ) from None


def safe_url(url: str | None) -> str | None:
    """A base URL without credentials (user:password@) or query, fit for names and logs."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


class ProviderModel(Model):
    """A model behind a provider's HTTP API (subclasses: OpenAI, Anthropic).

    ``max_tokens`` caps each answer and sizes the spend reserved before a call;
    ``stream=True`` forwards text deltas while the call runs (the journal keeps only the
    final message); ``prices`` overrides the price table for this model.
    """

    provider = "provider"
    extra = ""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout: float = DEFAULT_TIMEOUT,
        stream: bool = False,
        temperature: float | None = None,
        prices: Price | None = None,
        label: str | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self._api_key = api_key  # never journaled, never in repr or errors
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.stream = stream
        self.temperature = temperature
        self.name = label or f"{self.provider}:{model}"
        self.pricer = Pricer(self.name, self.price_provider(), model, prices)
        self._client: Any = None
        # Import the SDK now, when the app is loaded: importing it on the first call would
        # block the worker's event loop for a second (the anthropic SDK takes ~1 s), eating
        # the timeouts of every step in flight. A missing extra still fails at the call.
        with contextlib.suppress(MissingExtra):
            self.sdk()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def price_provider(self) -> str | None:
        """The provider id in ``genai-prices`` (None: match by model name)."""
        return self.provider

    # spend -----------------------------------------------------------------

    def estimate_input_tokens(self, request: ModelRequest) -> int:
        """An upper-leaning estimate of the prompt's tokens (about 3 characters a token)."""
        return math.ceil(_prompt_chars(request) / 3) + 16

    def worst_case(self, request: ModelRequest) -> tuple[int, float]:
        """Tokens and USD the call can cost at most: estimated input + ``max_tokens``."""
        tokens_in = self.estimate_input_tokens(request)
        return tokens_in + self.max_tokens, self.pricer.cost(tokens_in, self.max_tokens)

    def estimate_output_tokens(self, message: Message) -> int:
        """An upper-leaning estimate of an answer's tokens (about 3 characters a token)."""
        return math.ceil(_answer_chars(message) / 3)

    def counted(
        self,
        request: ModelRequest,
        message: Message,
        tokens_in: Any,
        tokens_out: Any,
        cached: Any = 0,
        written: Any = 0,
    ) -> tuple[Usage, float, str]:
        """The usage, cost and usage source of a finished answer.

        What the provider reported, where it is a plausible count; what it left out or
        cannot be a count (no usage object, a missing, negative or non-integer count, a
        zero count for a prompt or for an answer that has content, fewer tokens than
        :data:`MAX_CHARS_PER_TOKEN` allows for the text) is the gateway's own estimate, so
        an answer is never free and budgets bind whatever the provider reports.
        """
        source = UsageSource.REPORTED
        reported_in = _count(tokens_in)
        # A prompt is never 0 tokens, nor fewer than its characters allow.
        if not reported_in or reported_in < _prompt_chars(request) // MAX_CHARS_PER_TOKEN:
            reported_in, cached, written = self.estimate_input_tokens(request), 0, 0
            source = UsageSource.ESTIMATED
        reported_out = _count(tokens_out)
        if (
            reported_out is None
            or (reported_out == 0 and _has_content(message))
            or reported_out < _answer_chars(message) // MAX_CHARS_PER_TOKEN
        ):
            reported_out = self.estimate_output_tokens(message)
            source = UsageSource.ESTIMATED
        cached_n = min(_count(cached) or 0, reported_in)
        written_n = min(_count(written) or 0, reported_in - cached_n)
        usage = Usage(input_tokens=reported_in, output_tokens=reported_out, cached_tokens=cached_n)
        return usage, self.pricer.cost(reported_in, reported_out, cached_n, written_n), source

    def overlong(self, chars: int) -> None:
        """Stop reading a stream whose text is longer than ``max_tokens`` tokens can be: a
        provider that ignores the limit does not get to fill the worker's memory until the
        timeout (:class:`InvalidResponse`, counted at the reservation)."""
        if chars > self.max_tokens * MAX_CHARS_PER_TOKEN:
            raise InvalidResponse(
                f"{self.name}: the stream sent over {chars} characters, more than "
                f"max_tokens={self.max_tokens} can hold: not read further"
            )

    def reported(
        self,
        exc: ToolError,
        request: ModelRequest,
        message: Message,
        tokens_in: Any,
        tokens_out: Any,
        cached: Any = 0,
        written: Any = 0,
    ) -> ToolError:
        """A failed answer (empty, filtered, cut) that came with its usage carries it as
        ``reported_usage`` (tokens, USD): the provider billed it, so the attempt counts
        at that instead of its reservation. Only a count :meth:`counted` takes as
        reported is one: with any of it missing or implausible for ``message`` (what
        the provider sent), the attempt stays at its reservation."""
        usage, cost, source = self.counted(request, message, tokens_in, tokens_out, cached, written)
        if source == UsageSource.REPORTED:
            exc.reported_usage = (usage.total, cost)  # type: ignore[attr-defined]
        return exc

    # the call ----------------------------------------------------------------

    def client(self) -> Any:
        """The SDK client, made on first use (the SDK is imported only then)."""
        if self._client is None:
            self._client = self.make_client()
        return self._client

    def make_client(self) -> Any:
        raise NotImplementedError

    def client_options(self) -> dict[str, Any]:
        """What every SDK client is made with: no retries of its own (the engine retries
        by failure class, and an SDK retry would be a second, unjournaled attempt), the
        model's timeout, and its base URL and key when given."""
        options: dict[str, Any] = {"max_retries": 0, "timeout": self.timeout}
        if self.base_url:
            options["base_url"] = self.base_url
        if self._api_key:
            options["api_key"] = self._api_key
        return options

    async def aclose(self) -> None:
        """Close the SDK client's connections (a new one is made on the next call)."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One attempt: send, map the answer; errors raised as failure classes."""
        sdk = self.sdk()
        started = time.perf_counter()
        try:
            response = await self.send(request)
        except ToolError:
            raise
        except Exception as exc:
            raise classify(sdk, exc, self.name) from None
        response.latency_ms = round((time.perf_counter() - started) * 1000, 3)
        return response

    def sdk(self) -> Any:
        raise NotImplementedError

    async def send(self, request: ModelRequest) -> ModelResponse:
        raise NotImplementedError


#: The most tokens one call is counted at: a larger count is capped (it still binds
#: every budget) so that it fits the store's integer columns.
MAX_TOKENS_COUNTED = 10**12


def _count(value: Any) -> int | None:
    """A token count as the provider reported it, or None when it is not a count."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return min(value, MAX_TOKENS_COUNTED)


def finished(name: str, raw: str | None, reasons: Mapping[str, str], has_calls: bool) -> str:
    """Our finish reason (stop | tool_calls | refusal | length | content_filter) for the
    provider's, or the failure class of an answer that is not whole.

    Only a reason in ``reasons`` says the answer is whole: none, or one the gateway does
    not know (``error`` and ``abort`` from compatible servers, Anthropic's
    ``pause_turn``), is :class:`IncompleteAnswer`. Tool calls cut by the token limit are
    :class:`InvalidResponse`: the last call's arguments and the list itself may be cut,
    so none of them runs.
    """
    reason = reasons.get(raw) if raw is not None else None
    if reason is None:
        shown = "no finish reason" if raw is None else f"finish reason {str(raw)[:40]!r}"
        raise IncompleteAnswer(f"{name}: {shown} does not say the answer is whole: not an answer")
    if reason == FinishReason.LENGTH and has_calls:
        raise InvalidResponse(f"{name}: tool calls cut at max_tokens: none of them is run")
    return reason


def broke_off(sdk: Any, exc: BaseException) -> str | None:
    """What broke a stream while it was read, when it is the answer breaking off: the
    connection dropped (not a timeout, which stays one), or an ``error`` event inside the
    200 stream. None for anything else (a malformed event is an unusable answer)."""
    # The SDK's own HTTP client's errors, by name: SDK versions ship httpx or a fork of it.
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, sdk.APITimeoutError) or "TimeoutException" in names:
        return None
    if isinstance(exc, sdk.APIConnectionError) or "TransportError" in names:
        cause = exc.__cause__ if isinstance(exc, sdk.APIConnectionError) else None
        return f"broke off ({type(cause or exc).__name__})"
    if type(exc) is sdk.APIError:  # openai: an error event in the stream
        return f"broke off with an error event ({_message(exc)})"
    return None


#: More characters per token than any tokenizer packs on average over a text: a reported
#: count below a text's characters divided by this is not a count of that text.
MAX_CHARS_PER_TOKEN = 32


def _prompt_chars(request: ModelRequest) -> int:
    chars = sum(len(json.dumps(m.to_dict())) for m in request.messages)
    return chars + sum(len(json.dumps(t.parameters)) + len(t.description) for t in request.tools)


def _answer_chars(message: Message) -> int:
    return len(json.dumps(message.to_dict()))


def _has_content(message: Message) -> bool:
    return bool(message.content or message.refusal or message.tool_calls)


def classify(sdk: Any, exc: BaseException, name: str) -> ToolError:
    """An SDK exception as a failure class (the engine decides retry or fallback)."""
    if isinstance(exc, sdk.APITimeoutError):
        return ToolTimeout(f"{name}: no answer in time")
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__
        if cause is not None and "connect" in type(cause).__name__.lower():
            return NotSent(f"{name}: could not connect ({type(cause).__name__})")
        return ProviderError(f"{name}: connection failed ({type(cause or exc).__name__})")
    if isinstance(exc, sdk.APIResponseValidationError):
        return InvalidResponse(f"{name}: the answer does not parse: {exc}")
    if isinstance(exc, sdk.APIStatusError):
        if exc.status_code < 400:  # an error event inside a 200 stream: the answer broke off
            return IncompleteAnswer(f"{name}: the stream broke off: {_message(exc)}")
        return from_status(exc.status_code, _message(exc), _headers(exc), name)
    if isinstance(exc, json.JSONDecodeError | ValueError | KeyError | TypeError):
        return InvalidResponse(f"{name}: unusable answer ({type(exc).__name__}: {exc})")
    return ProviderError(f"{name}: {type(exc).__name__}: {exc}")


def from_status(status: int, message: str, headers: Any, name: str) -> ToolError:
    """An HTTP error answer as a failure class, carrying its ``status`` (the provider
    answered it: see :func:`~agentledger.models._errors.unbilled`)."""
    error = _from_status(status, message, headers, name)
    error.status = status  # type: ignore[attr-defined]
    return error


def _from_status(status: int, message: str, headers: Any, name: str) -> ToolError:
    lowered = message.lower()
    if status == 429:
        return RateLimited(f"{name}: 429 {message}", retry_after=retry_after(headers))
    if status in (408,):
        return ToolTimeout(f"{name}: 408 {message}")
    if status == 409 or status >= 500:
        return ProviderError(f"{name}: {status} {message}")
    if status == 413 or any(hint in lowered for hint in _CONTEXT_HINTS):
        return ContextWindowExceeded(f"{name}: context window exceeded: {message}")
    return ModelRejected(f"{name}: rejected with {status}: {message}", status=status)


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            parts = [str(err.get(k)) for k in ("code", "type", "message") if err.get(k)]
            if parts:
                return " ".join(parts)[:500]
    return str(getattr(exc, "message", exc))[:500]


def _headers(exc: Any) -> Any:
    response = getattr(exc, "response", None)
    return getattr(response, "headers", {}) or {}
