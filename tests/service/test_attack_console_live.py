"""Attacks on the console's live pages and its session cookie, on both backends: what a
page's own script asks for (the live list's stream, a run's event stream, the story it
fetches on each event) must not keep an unattended session alive, and a second console
cookie in the browser (one an earlier version set with ``Path=/``, or one another site
of the domain planted) must never decide whose session a request is."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentledger import App, ToolContext, WorkflowContext
from agentledger.service._console import sessions
from agentledger.tools._status import Status
from tests.service.conftest import Api, in_process, mint, served, settings_for, until
from tests.service.test_console_http import _bearer, browser, csrf_of, sign_in


@pytest.fixture
async def live(store_url: str) -> AsyncIterator[Api]:
    """The service with one inline worker and a 600 s idle time, on each backend."""
    settings = settings_for(store_url, workers_inline=1, console_idle=600, console_lifetime=7200)
    async with in_process(settings) as a:
        yield a


async def _last_seen(api: Api) -> float:
    (row,) = await api.store.read(
        lambda tx: tx.fetchall(
            "SELECT last_seen_at, created_at FROM console_sessions WHERE revoked_at IS NULL"
        )
    )
    return float(row["last_seen_at"] or row["created_at"])


async def _idle_for(api: Api, seconds: float) -> None:
    await api.store.transact(
        lambda tx: tx.execute(
            "UPDATE console_sessions SET last_seen_at = :t", {"t": time.time() - seconds}
        )
    )


async def test_a_pages_own_streams_and_fetches_do_not_restart_the_idle_clock(live: Api) -> None:
    """An open run page refetches its story on every event and its EventSource opens its
    stream again after any cut; the live list's stream likewise. None of them is the
    person: an unattended tab on a busy run must still end at the idle time."""
    key = await live.key("t1", "vera", ("operator",))
    body = {"agent": "free", "input": {"answer": 1}}
    run = (await live.client.post("/v1/runs", json=body, headers=key)).json()
    done = await live.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=key)
    assert done.status_code == 200, done.text
    async with browser(live, key) as client:
        await _idle_for(live, 500)
        story = await client.get(f"/ui/runs/{run['id']}/story")
        assert story.status_code == 200
        assert time.time() - await _last_seen(live) >= 500
        # The run ended: its stream sends what it has and closes (an EventSource would
        # open it again).
        events = await client.get(f"/ui/runs/{run['id']}/events")
        assert events.status_code == 200 and "run.completed" in events.text
        assert time.time() - await _last_seen(live) >= 500
        hub = live.app.state.hub
        reading = asyncio.create_task(client.get("/ui/runs/live"))

        async def streaming() -> bool:
            return any(kind == "tenant" for kind, _ in hub._waiters)

        try:
            await until(streaming)
            assert time.time() - await _last_seen(live) >= 500
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
        await _idle_for(live, 601)
        gone = await client.get("/ui/runs")
        assert gone.status_code == 303 and gone.headers["location"].startswith("/ui/signin")


def _second_session(api: Api) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url="http://console")


async def test_a_second_console_cookie_never_picks_the_session(live: Api) -> None:
    """A browser sends the ``Path=/ui`` cookie first and a ``Path=/`` one (an earlier
    version's, or planted from a sibling host) after it. Reading the last of the two
    would put the request under the other session: another tenant's console, or a
    sign-out that ends the wrong session and leaves the real one live."""
    mine = await live.key("t1", "vera", ("operator",))
    theirs = await live.key("t2", "mallory", ("operator",))
    async with browser(live, mine) as me, browser(live, theirs) as other:
        mine_id = me.cookies.get(sessions.COOKIE) or ""
        theirs_id = other.cookies.get(sessions.COOKIE) or ""
        both = {"Cookie": f"{sessions.COOKIE}={mine_id}; {sessions.COOKIE}={theirs_id}"}
        async with _second_session(live) as browser_with_two:
            r = await browser_with_two.get("/ui/runs", headers=both)
            # Never the other tenant's console: sent to sign in, which clears the
            # cookie set for Path=/.
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/signin")
            form = await browser_with_two.get("/ui/signin", headers=both)
            assert form.status_code == 200
        # A sign-in in that browser ends every session its cookies named, so no copy
        # of either outlives it.
        csrf = await csrf_of(me)
        assert csrf
        async with _second_session(live) as fresh:
            page = await fresh.get("/ui/signin")
            token = page.text.split('name="token" value="', 1)[1].split('"', 1)[0]
            signed = await fresh.post(
                "/ui/signin",
                data={"key": _bearer(mine), "next": "/ui/runs", "token": token},
                headers={"Cookie": f"agentledger_signin={token}; {both['Cookie']}"},
            )
            assert signed.status_code == 303
            cleared = [c for c in signed.headers.get_list("set-cookie") if "Path=/;" in c]
            assert any(c.startswith(f"{sessions.COOKIE}=") for c in cleared)
        for sid in (mine_id, theirs_id):
            async with _second_session(live) as thief:
                thief.cookies.set(sessions.COOKIE, sid)
                assert (await thief.get("/ui/runs")).status_code == 303


# Check now: whatever a provider answers, the audit trail keeps it -----------------------

hostile = App("hostile-provider")


@hostile.workflow(name="free", version="1")
async def _free(ctx: WorkflowContext, input: Any) -> Any:
    return input


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


_ANSWERS: dict[str, Any] = {
    "huge_error": lambda: Status("failed", error="e" * 2_000_000),
    "nan": lambda: Status.succeeded({"amount": float("nan"), "fee": float("inf")}),
    "mixed_keys": lambda: Status.succeeded({1: "one", "b": 2}),
    "tuple_keys": lambda: Status.succeeded({(1, 2): "pair"}),
    "cycle": lambda: Status.succeeded(_cycle()),
    "not_a_status": lambda: {"state": "succeeded"},
    "odd_state": lambda: Status("x" * 100_000),
}


async def _probe_status(ctx: ToolContext, args: dict[str, Any]) -> Any:
    """A provider that answers whatever the write's arguments ask for."""
    return _ANSWERS[args["mode"]]()


@hostile.tool(effect="write", idempotency="provider", status_check=_probe_status)
async def probe(ctx: ToolContext, mode: str) -> dict[str, Any]:
    return {"mode": mode}


@pytest.mark.parametrize("mode", sorted(_ANSWERS))
async def test_check_now_records_any_provider_answer_bounded(store_url: str, mode: str) -> None:
    """A huge error text, a result JSON cannot hold as it is (NaN, keys that are not
    text, a cycle), or something that is not a status at all: the check answers a page,
    and ``effect.checked`` records it, bounded, beside the ``effect.check_asked``."""
    settings = settings_for(store_url, workers_inline=1)
    async with in_process(settings, hostile) as api:
        operator = await api.key("t1", "olga", ("operator",))
        r = await api.client.post("/v1/runs", json={"agent": "free", "input": {}}, headers=operator)
        run_id = r.json()["id"]
        await api.client.get(f"/v1/runs/{run_id}/result?wait=30", headers=operator)

        def unknown_write(tx: Any) -> None:
            tx.execute("UPDATE runs SET status = 'needs_human' WHERE id = :id", {"id": run_id})
            tx.execute(
                "INSERT INTO steps (run_id, step_no, kind, name, status, input, attempts, "
                "lease_epoch, idempotency_key) VALUES (:id, 4, 'tool', 'probe', 'unknown', :i, "
                "1, 1, 'k-probe')",
                {"id": run_id, "i": json.dumps({"args": {"mode": mode}, "status_check": True})},
            )

        await api.store.transact(unknown_write)
        async with browser(api, operator) as client:
            token = await csrf_of(client, "/ui/effects")
            form = {"run_id": run_id, "step_no": "4", "csrf": token}
            checked = await client.post("/ui/effects/check", data=form)
            assert checked.status_code == 200, checked.text[:2000]
            assert len(checked.text) < 200_000
        found = await api.store.read(
            lambda tx: tx.fetchall(
                "SELECT type, data FROM events WHERE run_id = :id AND type LIKE 'effect.%' "
                "ORDER BY seq",
                {"id": run_id},
            )
        )
        assert [e["type"] for e in found] == ["effect.check_asked", "effect.checked"]
        assert len(found[1]["data"]) < 20_000
        assert json.loads(found[1]["data"])["key"] == "k-probe"


async def test_the_live_list_sends_no_rows_once_its_session_is_signed_out(
    store_url: str,
) -> None:
    """Over real HTTP: the list's stream shows a run, the person signs out, a run
    enters the page. The stream ends without its rows: the session is looked at before
    every page of rows it sends, not once a second."""
    settings = settings_for(store_url, workers_inline=1, audit_seal_every=0.05)
    with served(settings) as srv:
        olga = await mint(srv.app, "t1", "olga", ["operator"], 3600)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as api, \
                httpx.AsyncClient(base_url=srv.base_url, timeout=30) as client:  # fmt: skip
            assert (await sign_in(client, olga)).status_code == 303
            token = await csrf_of(client)
            frames: list[str] = []

            async def read() -> None:
                async with client.stream("GET", "/ui/runs/live?after=0") as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        frames.append(line)

            async def finished() -> str:
                run = (await api.post("/v1/runs", json={"agent": "free", "input": 1},
                                      headers=olga)).json()  # fmt: skip
                await api.get(f"/v1/runs/{run['id']}/result?wait=30", headers=olga)
                return str(run["id"])

            reading = asyncio.create_task(read())
            try:
                first = await finished()

                async def shown() -> bool:
                    return any(first in line for line in frames)

                await until(shown)
                out = await client.post("/ui/signout", data={"csrf": token})
                assert out.status_code == 303
                after = await finished()
                await asyncio.wait_for(reading, 30)  # the stream ended by itself
            finally:
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading
            assert not any(after in line for line in frames)
