"""A reconnect storm over many runs must not blind the event hub."""

from __future__ import annotations

import asyncio
import contextlib

from tests.service.conftest import Api


async def test_the_hub_wakes_a_stream_among_40000_watched_runs(sqlite_api: Api) -> None:
    """Every watched run is polled (in chunks): one query naming 40,000 ids would pass
    SQLite's limit of bound parameters and fail every poll, so no stream would wake."""
    h = await sqlite_api.key()
    run = (await sqlite_api.client.post("/v1/runs", json={"agent": "free"}, headers=h)).json()
    hub = sqlite_api.app.state.hub
    async with contextlib.AsyncExitStack() as stack:
        for i in range(40_000):
            await stack.enter_async_context(hub.watch(f"ghost-{i}"))
        changed = await stack.enter_async_context(hub.watch(run["id"]))
        await asyncio.wait_for(changed.wait(), timeout=20)  # its first head is seen
        changed.clear()
        r = await sqlite_api.client.post(f"/v1/runs/{run['id']}/cancel", headers=h)
        assert r.status_code in (200, 202)
        await asyncio.wait_for(changed.wait(), timeout=20)
