"""The HTTP service: an ASGI app (FastAPI) over the store.

The API process is stateless -- every answer comes from the database -- so several
``agentledger serve`` processes behind a load balancer on one PostgreSQL scale out.
Nothing executes in a request: a submit commits a queued run and returns 202; workers
(``agentledger worker``, or ``serve --workers-inline N``) run it.

FastAPI is the ``service`` extra: the names below load it when first used, so the parts
a worker uses without it (webhook delivery, keys, audit) import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The audit chain, registered with the kernel when imported (agentledger/_auditchain.py):
# every process that imports the service seals and prunes it.
from agentledger.service._queries import audit as _audit  # noqa: F401

if TYPE_CHECKING:
    from agentledger.service._app import create_app
    from agentledger.service._settings import ServiceSettings

__all__ = ["ServiceSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from agentledger.service._app import create_app

        return create_app
    if name == "ServiceSettings":
        from agentledger.service._settings import ServiceSettings

        return ServiceSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
