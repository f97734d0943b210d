"""The exception tree of agentledger.

Every error a user can see derives from :class:`AgentLedgerError` and carries a
message that says what happened and what to do::

    AgentLedgerError
    ├── UsageError                  bad input from a user: URL, JSON, names, versions
    │   └── UnknownTargetError      no agent/workflow of that name (and version)
    ├── StoreError                  the database failed or is unusable
    │   ├── StoreUnavailable        cannot connect / locked (transient; retried)
    │   │   └── StoreLocked         another process held the whole database's write lock
    │   └── StoreCorrupt            the file is not a usable database
    ├── LeaseLost                   a fenced write was rejected: another worker owns the run
    ├── ToolError                   a tool call failed; the subclass is its failure class
    │   ├── RateLimited             429: retried with backoff, honouring Retry-After
    │   ├── ProviderError           5xx: reads retried twice; a write's 5xx is an unknown outcome
    │   │   └── NotSent             could not connect: provably never sent, safe to resend
    │   ├── ToolTimeout             no answer in time: reads retried once, writes are unknown
    │   ├── DeadlineReached         no time left before the run's deadline: never called
    │   ├── InProgress              409 in progress: the same request runs; wait and check
    │   ├── InvalidArguments        schema/validation: fed back to the model once
    │   ├── Refused                 refusal or policy block: never retried
    │   └── BusinessError           the tool's answer (sold out, declined): never retried

Control signals (not errors) live in :mod:`agentledger.engine._signals`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class FailureClass(StrEnum):
    """The class of a failed call (``error_class``): it selects the retry rule
    (:mod:`agentledger.engine._retries`) and is journaled with the failure."""

    TOOL_ERROR = "tool_error"
    RATE_LIMITED = "rate_limited"
    PROVIDER_ERROR = "provider_error"
    DEADLINE = "deadline"
    TIMEOUT = "timeout"
    IN_PROGRESS = "in_progress"
    INVALID_ARGUMENTS = "invalid_arguments"
    REFUSED = "refused"
    BUSINESS_ERROR = "business_error"
    # The engine's and the gateway's own.
    STEP_FAILED = "step_failed"
    NOT_ALLOWED = "not_allowed"
    NOT_JOURNALABLE = "not_journalable"
    INCOMPLETE_ANSWER = "incomplete_answer"
    CONTEXT_WINDOW = "context_window"
    INVALID_RESPONSE = "invalid_response"
    MODEL_REJECTED = "model_rejected"
    MISSING_EXTRA = "missing_extra"


class AgentLedgerError(Exception):
    """Root of every error agentledger raises on purpose."""


class UsageError(AgentLedgerError):
    """The caller passed something unusable; the message says how to fix it."""


class UnknownTargetError(UsageError):
    """No agent or workflow with that name (and version) is known."""


class StoreError(AgentLedgerError):
    """The store could not do what was asked."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or is locked; retrying later may work."""


class StoreLocked(StoreUnavailable):
    """Another process held the database's one write lock (SQLite's, for the whole file)
    past the busy timeout: every write waits for it alike until that process lets go."""


class StoreCorrupt(StoreError):
    """The database file exists but is not a usable agentledger store."""


class LeaseLost(AgentLedgerError):
    """A fenced write was refused because the run's lease epoch moved on.

    The worker that gets this no longer owns the run and must stop working on it.
    """

    def __init__(self, run_id: str, epoch: int) -> None:
        super().__init__(f"lease lost on run {run_id} (epoch {epoch}); another worker owns it")
        self.run_id = run_id
        self.epoch = epoch


class ToolError(AgentLedgerError):
    """A tool call failed. ``error_class`` selects the retry rule."""

    error_class: str = FailureClass.TOOL_ERROR

    def __init__(self, message: str, *, data: Any = None) -> None:
        super().__init__(message)
        self.data = data


class RateLimited(ToolError):
    """The provider said 429; ``retry_after`` is its Retry-After in seconds, if any."""

    error_class = FailureClass.RATE_LIMITED

    def __init__(self, message: str = "rate limited", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ProviderError(ToolError):
    """The provider failed: it answered 5xx, or could not be reached.

    A 5xx answer to a write is *indeterminate* (Stripe: "you may still see requests
    with a 500 error that produce user-visible side effects", and the saved 500 is
    replayed for the same key): the engine treats it as an unknown outcome.
    """

    error_class = FailureClass.PROVIDER_ERROR
    #: True only when the request provably never reached the provider.
    not_sent = False


class NotSent(ProviderError):
    """The request provably never left this process (connection refused): sending it
    again cannot apply anything twice."""

    not_sent = True


class DeadlineReached(ToolError):
    """No time was left before the run's deadline, so the tool was *not called*.

    Not called means not applied: a final failure, never an unknown outcome.
    """

    error_class = FailureClass.DEADLINE


class ToolTimeout(ToolError):
    """The call did not answer in time; for a write the outcome is unknown."""

    error_class = FailureClass.TIMEOUT


class InProgress(ToolError):
    """409 "request in progress": the same key's first request is still running at the
    provider. Not an answer: wait, then check or send again with the same key."""

    error_class = FailureClass.IN_PROGRESS


class InvalidArguments(ToolError):
    """The arguments do not fit the tool's schema (or the tool is unknown)."""

    error_class = FailureClass.INVALID_ARGUMENTS


class Refused(ToolError):
    """A refusal or policy block. Never retried."""

    error_class = FailureClass.REFUSED


class BusinessError(ToolError):
    """The tool's own answer, such as sold out or card declined. Never retried."""

    error_class = FailureClass.BUSINESS_ERROR
