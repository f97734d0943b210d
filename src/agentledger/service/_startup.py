"""What ``agentledger serve`` says about itself: the line naming the app, the database
and the address once it listens, and uvicorn's lines in the process's own log format.
(The access lines are :class:`~agentledger.service._problems.RequestMiddleware`'s.)"""

from __future__ import annotations

import logging
from typing import Any

import uvicorn

from agentledger._app import App
from agentledger.service._problems import ACCESS_LOGGER
from agentledger.service._settings import ServiceSettings
from agentledger.store._sqlstore import redacted_url

log = logging.getLogger("agentledger.service")


def start_line(agent_app: App, settings: ServiceSettings) -> str:
    """``serving app A (targets ...) from database D, N inline workers``."""
    targets = ", ".join(sorted(agent_app.targets())) or "none"
    workers = settings.workers_inline
    return (
        f"serving app {agent_app.name} (targets {targets}) from database "
        f"{redacted_url(settings.db_url)}, {workers} inline worker{'' if workers == 1 else 's'}"
    )


def route_uvicorn_logs() -> None:
    """uvicorn's loggers write through the process's handler (its format, json too),
    not through handlers of their own."""
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def quiet_access_log() -> None:
    """No access lines (``serve --no-access-log``)."""
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.WARNING)


class ListeningServer(uvicorn.Server):
    """uvicorn's server, which logs what it serves once it listens (with the address
    a ``--port 0`` got)."""

    def __init__(self, config: uvicorn.Config, what: str) -> None:
        super().__init__(config)
        self.what = what

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        addresses = []
        for server in self.servers:
            for sock in server.sockets or ():
                host, port = sock.getsockname()[:2]
                addresses.append(f"http://{f'[{host}]' if ':' in host else host}:{port}")
        log.info("%s, listening on %s", self.what, ", ".join(addresses) or "?")
