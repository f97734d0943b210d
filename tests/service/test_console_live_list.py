"""The runs list follows the tenant's event stream over real HTTP: it sends the page's
rows again only when an event could change them (an event of a run it shows, or of a run
that now matches its filter), never because time passed; its frames' ids are the
tenant's chain position, so a reconnect with ``Last-Event-ID`` gets rows again only
when something happened meanwhile. On both backends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.service.conftest import mint, served, settings_for, until
from tests.service.test_console_http import sign_in

_LIVE = re.compile(r'data-live="([^"]+)"')


@dataclass
class Frames:
    """The frames one stream sent, as they come."""

    seen: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        return [f for f in self.seen if f.get("event") == "rows"]

    def last_id(self) -> int:
        ids = [int(f["id"]) for f in self.seen if "id" in f]
        return ids[-1] if ids else -1


@contextlib.asynccontextmanager
async def following(
    client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
) -> AsyncIterator[Frames]:
    frames = Frames()

    async def read() -> None:
        async with client.stream("GET", url, headers=headers or {}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream"
            )
            frame: dict[str, Any] = {}
            async for line in r.aiter_lines():
                if not line:
                    if frame:
                        frames.seen.append(frame)
                    frame = {}
                    continue
                name, _, value = line.partition(": ")
                frame[name] = value

    task = asyncio.create_task(read())
    try:
        yield frames
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _sealed_to(client: httpx.AsyncClient, run_id: str, key: dict[str, str],
                     app: Any) -> int:  # fmt: skip
    """The chain position of the run's last event once every event of it is sealed."""
    store = app.state.store

    async def chained() -> int | None:
        rows = await store.read(
            lambda tx: tx.fetchall(
                "SELECT MAX(chain_no) AS n, SUM(CASE WHEN chain_no IS NULL THEN 1 ELSE 0 END) "
                "AS open FROM events WHERE run_id = :id",
                {"id": run_id},
            )
        )
        return int(rows[0]["n"]) if rows and rows[0]["n"] and not rows[0]["open"] else None

    found: list[int] = []

    async def done() -> bool:
        n = await chained()
        if n is not None:
            found.append(n)
        return n is not None

    await until(done, 30)
    return found[-1]


async def test_the_list_reads_its_page_again_only_when_an_event_could_change_it(
    store_url: str,
) -> None:
    settings = settings_for(store_url, workers_inline=1, audit_seal_every=0.05)
    with served(settings) as srv:
        olga = await mint(srv.app, "t1", "olga", ["operator"], 3600)
        fred = await mint(srv.app, "t2", "fred", ["operator"], 3600)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as api, \
                httpx.AsyncClient(base_url=srv.base_url, timeout=30) as browser:  # fmt: skip
            r = await sign_in(browser, olga)
            assert r.status_code == 303
            page = await browser.get("/ui/runs?status=needs_human")
            live = _LIVE.search(page.text)
            assert live and "after=" in live.group(1), page.text
            url = live.group(1).replace("&amp;", "&")

            async def finished(body: dict[str, Any], key: dict[str, str], status: str) -> str:
                run = (await api.post("/v1/runs", json=body, headers=key)).json()
                done = await api.get(f"/v1/runs/{run['id']}/result?wait=30", headers=key)
                assert done.json()["status"] == status, done.text
                return str(run["id"])

            async with following(browser, url) as frames:
                # Runs the page (needs_human) can never show: one that completes in this
                # tenant, one of another tenant. The stream sees the first's events (its
                # position passes them) and reads nothing.
                quiet = await finished({"agent": "free", "input": 1}, olga, "completed")
                await finished({"agent": "over_budget"}, fred, "needs_human")
                passed = await _sealed_to(api, quiet, olga, srv.app)

                async def past_it() -> bool:
                    return frames.last_id() >= passed

                await until(past_it)
                assert frames.rows() == [], frames.seen  # no read, no rows
                # A run that enters the page: its rows come, once.
                handed = await finished({"agent": "over_budget"}, olga, "needs_human")

                async def shown() -> bool:
                    return any(handed in f["data"] for f in frames.rows())

                await until(shown)
                (rows,) = frames.rows()
                html = json.loads(rows["data"])["html"]
                assert f'data-run="{handed}"' in html and "needs human" in html
                assert quiet not in html
                mark = int(rows["id"])
                # Nothing happens for a while: positions, never rows.
                await until(lambda: _later(frames, mark))
                assert len(frames.rows()) == 1
            # A reconnect from where it was: nothing happened meanwhile, so no rows.
            last = str(frames.last_id())
            async with following(browser, url, {"Last-Event-ID": last}) as again:
                await until(lambda: _position_after(again, 0))
                assert again.rows() == []
            # From before the run entered: its rows at once.
            async with following(browser, url, {"Last-Event-ID": str(passed)}) as again:
                await until(lambda: _has_rows(again))
                assert handed in again.rows()[0]["data"]


async def _later(frames: Frames, mark: int) -> bool:
    return any(f.get("event") == "position" and int(f["id"]) >= mark for f in frames.seen)


async def _position_after(frames: Frames, mark: int) -> bool:
    return any(f.get("event") == "position" for f in frames.seen)


async def _has_rows(frames: Frames) -> bool:
    return bool(frames.rows())
