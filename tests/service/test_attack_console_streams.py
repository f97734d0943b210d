"""Attacks on the console's streams: an open stream must not outlive its session (a
sign-out, the session's expiry, its key revoked), nor follow another tenant's run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from agentledger.service._console import sessions
from tests.service.conftest import Api
from tests.service.test_console_http import browser, csrf_of

# A bound on how long an ended session's stream may take to close: generous (the
# streams look at their session every second); only a stream that never ends hits it.
_BOUND = 30.0


async def _sign_out(api: Api, client: httpx.AsyncClient) -> None:
    token = await csrf_of(client)
    r = await client.post("/ui/signout", data={"csrf": token})
    assert r.status_code == 303


async def _expire(api: Api, client: httpx.AsyncClient) -> None:
    await api.store.transact(lambda tx: tx.execute("UPDATE console_sessions SET expires_at = 1"))


async def _revoke_key(api: Api, client: httpx.AsyncClient) -> None:
    await api.store.transact(lambda tx: tx.execute("UPDATE api_keys SET revoked_at = 1"))
    api.app.state.keys._rows.clear()  # as after the key cache's few seconds


_ENDINGS: dict[str, Callable[[Api, httpx.AsyncClient], Awaitable[None]]] = {
    "sign-out": _sign_out,
    "expiry": _expire,
    "key revoked": _revoke_key,
}


@pytest.mark.parametrize("ending", list(_ENDINGS))
async def test_an_open_stream_ends_with_its_session(api: Api, ending: str) -> None:
    key = await api.key("t1", "olga", ("operator",))
    # A run no worker takes: its stream would go on for as long as the run waits.
    run = (await api.client.post("/v1/runs", json={"agent": "free", "input": 1},
                                 headers=key)).json()  # fmt: skip
    async with browser(api, key) as client:
        stolen = client.cookies.get(sessions.COOKIE) or ""
        streams: list[asyncio.Task[Any]] = []
        answering: list[asyncio.Event] = []
        for path in (f"/ui/runs/{run['id']}/events", "/ui/runs/live"):
            answering.append(asyncio.Event())
            app = _frames_seen(api.app, answering[-1])
            tab = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                    base_url="http://console")  # fmt: skip
            tab.cookies.set(sessions.COOKIE, stolen)
            streams.append(asyncio.create_task(_read_all(tab, path)))
        # Both streams are open and answering: each sent a frame after its first (a
        # heartbeat at least), and neither has ended by itself.
        await asyncio.wait_for(asyncio.gather(*(a.wait() for a in answering)), _BOUND)
        assert not any(s.done() for s in streams), [s.result() for s in streams if s.done()]
        await _ENDINGS[ending](api, client)
        done = await asyncio.wait_for(asyncio.gather(*streams), _BOUND)
    for status, text in done:
        assert status == 200 and "retry:" in text


def _frames_seen(app: Any, answering: asyncio.Event) -> Any:
    """``app``, setting ``answering`` once a response sent a second body frame while it
    goes on (``httpx.ASGITransport`` hands the client the body only when it ended)."""

    async def observed(scope: Any, receive: Any, send: Any) -> None:
        frames = 0

        async def counting(message: Any) -> None:
            nonlocal frames
            if message["type"] == "http.response.body" and message.get("more_body"):
                frames += 1
                if frames >= 2:
                    answering.set()
            await send(message)

        await app(scope, receive, counting)

    return observed


async def _read_all(client: httpx.AsyncClient, path: str) -> tuple[int, str]:
    async with client:
        r = await client.get(path)
        return r.status_code, r.text
