"""What a status check answers: did the write with key K happen?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Status:
    """The provider's answer about one idempotency key.

    ``succeeded`` carries the original result; ``not_found`` means nothing
    happened and the call may be retried with the same key; ``pending`` means
    ask again later; ``failed`` carries the provider's error.
    """

    state: str
    result: Any = None
    error: str | None = None

    @classmethod
    def succeeded(cls, result: Any) -> Status:
        return cls("succeeded", result=result)

    @classmethod
    def not_found(cls) -> Status:
        return cls("not_found")

    @classmethod
    def pending(cls) -> Status:
        return cls("pending")

    @classmethod
    def failed(cls, error: str) -> Status:
        return cls("failed", error=error)
