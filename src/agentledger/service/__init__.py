"""The HTTP service: an ASGI app (FastAPI) over the store.

The API process is stateless -- every answer comes from the database -- so several
``agentledger serve`` processes behind a load balancer on one PostgreSQL scale out.
Nothing executes in a request: a submit commits a queued run and returns 202; workers
(``agentledger worker``, or ``serve --workers-inline N``) run it.
"""

from agentledger.service.app import create_app
from agentledger.service.settings import ServiceSettings

__all__ = ["ServiceSettings", "create_app"]
