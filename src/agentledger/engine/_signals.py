"""Control signals of the engine: not errors, and not catchable as ``Exception``.

They derive from ``BaseException`` so that workflow code with a broad
``except Exception`` cannot swallow a park, a handover or a lost lease.
"""

from __future__ import annotations

from enum import StrEnum


class RunSignal(BaseException):
    """Base of the engine's control flow."""


class Park(RunSignal):
    """Stop executing now; the run waits until ``available_at`` (None: until decided)."""

    def __init__(self, available_at: float | None, why: str, committed: bool = False) -> None:
        super().__init__(why)
        self.available_at = available_at
        self.why = why
        self.committed = committed  # the run was already set waiting in the step's batch


class HandoverReason(StrEnum):
    """Why a run was handed to a human (``runs.handover_reason`` of a ``needs_human`` run)."""

    BUDGET = "budget"  # a budget of the run or its tenant was used up
    UNKNOWN_OUTCOME = "unknown_outcome"  # a write may or may not have been applied
    COMPENSATION = "compensation"  # an undo could not be settled
    MODEL_ERROR = "model_error"  # every model of the chain failed
    NONDETERMINISM = "nondeterminism"  # the code no longer matches the journal
    INVALID_ARGUMENTS = "invalid_arguments"  # the model kept proposing unusable arguments
    OUTBOX_KEY = "outbox_key"  # an outbox key was taken by another call
    RESUMES = "resumes"  # resumed too often after losing its worker


class Handover(RunSignal):
    """Hand the run to a human (``needs_human``): a budget was hit or an outcome is unknown."""

    def __init__(self, reason: HandoverReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Abandon(RunSignal):
    """Stop working on the run without writing: the lease is lost or the worker stops.

    ``error``: the store failed for a reason that is not the run's (disk full, I/O
    error, read-only, connection lost) and retrying did not cure it; the engine hands
    it to the worker, which gives the run back and reports the cause."""

    def __init__(self, why: str, release: bool = False, error: BaseException | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.release = release
        self.error = error


class RunFailed(RunSignal):
    """End the run as ``failed`` (e.g. the model refused); compensations run first."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


class Cancelled(RunSignal):
    """A cancel was requested: stop at this step boundary, compensate, end ``cancelled``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
