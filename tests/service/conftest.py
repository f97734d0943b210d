"""Service fixtures: the ASGI app in process (fast) and under uvicorn (real HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from agentledger import App
from agentledger.records import RunStatus
from agentledger.service import ServiceSettings, create_app
from agentledger.service._auth import create_key
from agentledger.service._server import uvicorn_config
from agentledger.store import Store
from tests.conftest import migrated_sqlite
from tests.service import service_app

PEPPER = b"service-test-pepper-0123456789"


def settings_for(url: str, **overrides: Any) -> ServiceSettings:
    """Fast settings for tests (short polls and heartbeats)."""
    values: dict[str, Any] = {
        "db_url": url,
        "pepper": PEPPER,
        "event_poll": 0.01,
        "sse_heartbeat": 0.5,
        "key_cache_seconds": 0.2,
        # The test receivers listen on loopback (tests/loopback_http.py).
        "webhook_allow_hosts": ("127.0.0.1",),
    }
    values.update(overrides)
    return ServiceSettings(**values)


@dataclass
class Api:
    """An app, a client on it, and helpers to mint keys."""

    app: FastAPI
    client: httpx.AsyncClient
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        store: Store = self.app.state.store
        return store

    async def key(
        self, tenant: str = "t1", user: str = "alice", roles: tuple[str, ...] = ("operator",),
        expires_in: float = 3600,
    ) -> dict[str, str]:  # fmt: skip
        """Authorization headers of a new key."""
        full, _ = await create_key(self.store, PEPPER, tenant, user, list(roles), expires_in)
        return {"Authorization": f"Bearer {full}"}


@contextlib.asynccontextmanager
async def in_process(settings: ServiceSettings, agent_app: App | None = None) -> AsyncIterator[Api]:
    """The app (serving ``agent_app``, by default the service tests' own) with its
    lifespan, and an httpx client over ASGI (no sockets)."""
    api = create_app(settings, agent_app or service_app.app)
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield Api(api, client)


@pytest.fixture
async def api(store_url: str) -> AsyncIterator[Api]:
    """The service in process on each backend, no workers."""
    async with in_process(settings_for(store_url)) as a:
        yield a


@pytest.fixture
async def sqlite_api(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Api]:
    """The service in process on SQLite only (a fresh migrated file), no workers."""
    async with in_process(settings_for(migrated_sqlite(sqlite_template, tmp_path / "svc.db"))) as a:
        yield a


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """A uvicorn server on a loopback port, in a thread of this process."""

    base_url: str
    app: FastAPI
    server: uvicorn.Server


@contextlib.contextmanager
def served(settings: ServiceSettings) -> Iterator[Served]:
    """Serve the app under uvicorn on 127.0.0.1 (real HTTP); stopped on exit."""
    api = create_app(settings, service_app.app)
    port = free_port()
    config = uvicorn_config(api, "127.0.0.1", port, settings.client_bounds, "warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = threading.Event()

    def wait_started() -> None:
        while not server.started and thread.is_alive():
            started.wait(0.01)

    wait_started()
    try:
        yield Served(f"http://127.0.0.1:{port}", api, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


async def mint(app: FastAPI, *args: Any, **kwargs: Any) -> dict[str, str]:
    """A key on a served app's store (runs on the app's own loop via the store thread)."""
    full, _ = await create_key(app.state.store, PEPPER, *args, **kwargs)
    return {"Authorization": f"Bearer {full}"}


async def until(predicate: Any, timeout: float = 20.0) -> None:
    """Poll an async predicate until true (each check is a positive signal)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


#: The first time to live of :func:`pending_in_time`'s approvals, doubled after each miss.
FIRST_TTL = 1.0
#: Past this time to live a miss is a failure: something keeps the approval from showing.
LAST_TTL = 64.0


async def pending_in_time(
    api: Api,
    headers: dict[str, str],
    start: Callable[[float], Awaitable[str]],
    ttl: float = FIRST_TTL,
) -> dict[str, Any]:
    """A run seen waiting on its approval before the approval expired, as shown then.

    ``start(ttl)`` starts a run whose approval lives ``ttl`` seconds and returns its id.
    A short time to live keeps a test of expiry from waiting long; a loaded machine can
    let it expire before the run is seen waiting, so a run missed that way is followed
    by one whose approval lives twice as long (seen or missed is judged on the clock the
    approval's ``expires_at`` is on, never by how long anything took)."""
    while ttl <= LAST_TTL:
        run_id = await start(ttl)
        while True:
            shown = (await api.client.get(f"/v1/runs/{run_id}", headers=headers)).json()
            pending = shown["pending_approval"]
            if pending and shown["status"] == "waiting" and time.time() < pending["expires_at"]:
                return dict(shown)
            if (pending and time.time() >= pending["expires_at"]) or shown[
                "status"
            ] in RunStatus.TERMINAL:
                break  # expired before it was seen waiting: missed
            await asyncio.sleep(0.02)
        ttl *= 2
    raise AssertionError(f"no approval was seen pending within a time to live of {LAST_TTL} s")
