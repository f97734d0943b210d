"""What a service submit takes and gives back: shared by the per-request path
(:mod:`~agentledger.store.queries.service_runs`) and the set-based one
(:mod:`~agentledger.service.accepting`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentledger.errors import StoreError
from agentledger.records import Run
from agentledger.store.base import NewRun
from agentledger.store.queries.service_quota import Quota


class IdempotencyMismatch(StoreError):
    """The Idempotency-Key was used before with a different request body."""


@dataclass
class IdempotencyRequest:
    """The key, the request's fingerprint, how long the key is kept."""

    key: str
    fingerprint: str
    ttl_seconds: float


@dataclass
class Submitted:
    """The run a submit created or found, and the response body recorded with it."""

    run: Run
    replayed: bool
    response: Any = None


@dataclass
class SubmitRequest:
    """One submit of a group (see :func:`submit_group`)."""

    new: NewRun
    principal: dict[str, Any]
    webhook: str | None
    idem: IdempotencyRequest | None
    quota: Quota
    respond: Any
    request_id: str | None = None
