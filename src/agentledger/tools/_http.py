"""Mapping provider HTTP answers to failure classes, in one place.

Tools that call HTTP providers use :func:`raise_for_provider` so the engine can
retry by class (429 with Retry-After, 5xx, business errors never).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentledger._backoff import retry_after_seconds
from agentledger.errors import (
    BusinessError,
    InProgress,
    InvalidArguments,
    NotSent,
    ProviderError,
    RateLimited,
    Refused,
    ToolTimeout,
)

if TYPE_CHECKING:
    import httpx


def _error_code(detail: Any) -> Any:
    """The provider's error code: ``{"error": "code"}`` or ``{"error": {"code": ...}}``."""
    if isinstance(detail, dict):
        return detail.get("code", detail.get("type"))
    return detail


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
        # An answered 5xx: for a write the engine treats it as an unknown outcome.
        raise ProviderError(f"provider error {status}: {detail}")
    if status == 409 and _error_code(detail) == "request_in_progress":
        raise InProgress(f"request in progress ({status}): {detail}", data=body)
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
    connection that could not be opened (refused, or timed out while connecting)
    provably sent nothing and becomes :class:`NotSent` (safe to send again).
    """
    # Imported here: every command imports this module, few send a request, and httpx
    # is a costly import (it loads its own command line's dependencies).
    import httpx

    try:
        response = await client.request(method, url, **kwargs)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise NotSent(f"cannot connect to {url}: {exc}") from exc
    except httpx.TimeoutException as exc:
        raise ToolTimeout(f"{method} {url} timed out") from exc
    except httpx.TransportError as exc:
        # The request may have reached the provider: treat like a timeout (unknown).
        raise ToolTimeout(f"{method} {url} failed in transit: {exc}") from exc
    raise_for_provider(response)
    return response
