"""Failure classes of model calls, on top of the tool failure classes.

The engine retries model calls by class like any read (:mod:`agentledger.engine._retries`):
``rate_limited`` (429), ``provider_error`` (5xx, 409, connection), ``timeout`` (408, no
answer in time), and :class:`IncompleteAnswer` (a stream that stopped before the
provider said the answer was finished), retried as a provider error. The other classes
here never retry on the same model:

* :class:`ContextWindowExceeded` and :class:`InvalidResponse` fall back to the next model
  of the chain (another model may have a larger window or answer properly);
* :class:`ModelRejected` (400/401/403/404/422) fails at once: the request or the
  configuration is wrong, and another attempt would be billed for the same answer;
* a content filter is :class:`~agentledger.errors.Refused`: never retried.
"""

from __future__ import annotations

from agentledger.errors import (
    DeadlineReached,
    FailureClass,
    NotSent,
    ProviderError,
    RateLimited,
    ToolError,
    ToolTimeout,
)


class IncompleteAnswer(ProviderError):
    """A streamed answer stopped before the provider's finish signal (a finish reason,
    ``message_stop``): the text so far is not the answer, whatever it says."""

    error_class = FailureClass.INCOMPLETE_ANSWER


class ContextWindowExceeded(ToolError):
    """The conversation does not fit the model's context window."""

    error_class = FailureClass.CONTEXT_WINDOW


class InvalidResponse(ToolError):
    """The provider answered, but the answer is unusable (empty, unparseable)."""

    error_class = FailureClass.INVALID_RESPONSE


class ModelRejected(ToolError):
    """The provider rejected the request (bad request, key, permission, model name)."""

    error_class = FailureClass.MODEL_REJECTED

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class MissingExtra(ModelRejected):
    """The SDK of a provider is not installed (``pip install agentledger[openai]``)."""

    error_class = FailureClass.MISSING_EXTRA


#: Classes after which the next model of a fallback chain is tried (once the engine's
#: retries of the class are used up, for the retryable ones).
FALLBACK_CLASSES = frozenset(
    {
        RateLimited.error_class,
        ProviderError.error_class,
        ToolTimeout.error_class,
        ContextWindowExceeded.error_class,
        InvalidResponse.error_class,
        IncompleteAnswer.error_class,
    }
)


def unbilled(exc: BaseException) -> bool:
    """Whether a failed attempt provably cost nothing: it never left (not sent, no time
    left), or the provider answered it with an error status before doing the work
    (``status`` set by :func:`~agentledger.models._provider.from_status`). Anything else
    (a timeout, a connection lost after sending, a stream cut short, an unusable answer)
    may have been processed and billed, so it counts at its reservation."""
    if isinstance(exc, NotSent | DeadlineReached | MissingExtra):
        return True
    status = getattr(exc, "status", None)
    return isinstance(status, int) and status >= 400
