"""Failure classes of model calls, on top of the tool failure classes.

The engine retries model calls by class like any read (:mod:`agentledger.engine.retries`):
``rate_limited`` (429), ``provider_error`` (5xx, 409, connection), ``timeout`` (408, no
answer in time). The classes here never retry on the same model:

* :class:`ContextWindowExceeded` and :class:`InvalidResponse` fall back to the next model
  of the chain (another model may have a larger window or answer properly);
* :class:`ModelRejected` (400/401/403/404/422) fails at once: the request or the
  configuration is wrong, and another attempt would be billed for the same answer;
* a content filter is :class:`~agentledger.errors.Refused`: never retried.
"""

from __future__ import annotations

from agentledger.errors import ProviderError, RateLimited, Refused, ToolError, ToolTimeout


class ContextWindowExceeded(ToolError):
    """The conversation does not fit the model's context window."""

    error_class = "context_window"


class InvalidResponse(ToolError):
    """The provider answered, but the answer is unusable (empty, unparseable)."""

    error_class = "invalid_response"


class ModelRejected(ToolError):
    """The provider rejected the request (bad request, key, permission, model name)."""

    error_class = "model_rejected"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class MissingExtra(ModelRejected):
    """The SDK of a provider is not installed (``pip install agentledger[openai]``)."""

    error_class = "missing_extra"


#: Classes after which the next model of a fallback chain is tried (once the engine's
#: retries of the class are used up, for the retryable ones).
FALLBACK_CLASSES = frozenset(
    {
        RateLimited.error_class,
        ProviderError.error_class,
        ToolTimeout.error_class,
        ContextWindowExceeded.error_class,
        InvalidResponse.error_class,
    }
)

#: Classes that end the model step at once, whatever the chain.
FATAL_CLASSES = frozenset({ModelRejected.error_class, Refused.error_class, "missing_extra"})
