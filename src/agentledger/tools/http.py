"""Mapping provider HTTP answers to failure classes, in one place.

Tools that call HTTP providers use :func:`raise_for_provider` so the engine can
retry by class (429 with Retry-After, 5xx, business errors never).
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from agentledger.errors import (
    BusinessError,
    InvalidArguments,
    ProviderError,
    RateLimited,
    Refused,
    ToolTimeout,
)


def retry_after_seconds(value: str | None) -> float | None:
    """Parse Retry-After: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        import time

        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:500]


def raise_for_provider(response: httpx.Response) -> None:
    """Raise the failure class that matches a non-2xx provider response."""
    status = response.status_code
    if status < 400:
        return
    body = _body(response)
    detail = body.get("error", body) if isinstance(body, dict) else body
    if status == 429:
        raise RateLimited(
            f"rate limited: {detail}",
            retry_after=retry_after_seconds(response.headers.get("Retry-After")),
        )
    if status >= 500:
        raise ProviderError(f"provider error {status}: {detail}")
    if status == 400 or (status == 422 and detail == "validation_error"):
        raise InvalidArguments(f"rejected arguments ({status}): {detail}", data=body)
    if status == 403:
        raise Refused(f"refused ({status}): {detail}", data=body)
    raise BusinessError(f"{detail}", data=body)


async def call_provider(
    client: httpx.AsyncClient, method: str, url: str, **kwargs: Any
) -> httpx.Response:
    """Send a request, mapping transport failures to failure classes.

    A timeout becomes :class:`ToolTimeout` (for a write: outcome unknown); a
    connection refused before anything was sent becomes :class:`ProviderError`.
    """
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.TimeoutException as exc:
        raise ToolTimeout(f"{method} {url} timed out") from exc
    except httpx.ConnectError as exc:
        raise ProviderError(f"cannot connect to {url}: {exc}") from exc
    except httpx.TransportError as exc:
        # The request may have reached the provider: treat like a timeout (unknown).
        raise ToolTimeout(f"{method} {url} failed in transit: {exc}") from exc
    raise_for_provider(response)
    return response
