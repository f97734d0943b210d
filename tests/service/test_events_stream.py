"""Server-sent events: resumable, gapless, in order, the terminal event re-sent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentledger.service._queries import events as service_events
from agentledger.store import open_store
from tests.engine.helpers import Env
from tests.service.conftest import Api, mint, served, settings_for, until

APP = "tests.service.service_app:app"


async def read_events(
    client: httpx.AsyncClient, path: str, headers: dict[str, str], stop_after: int | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Read an SSE stream; stop (drop the connection) after ``stop_after`` events."""
    events: list[dict[str, Any]] = []
    extras: list[str] = []
    async with client.stream("GET", path, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        async for line in r.aiter_lines():
            if line == "":
                if "data" in fields:
                    events.append({"id": int(fields["id"]), **json.loads(fields["data"])})
                    assert events[-1]["type"] == fields["event"]
                fields = {}
                if stop_after is not None and len(events) >= stop_after:
                    break  # the client goes away mid-run
                continue
            if line.startswith(":") or line.startswith("retry:"):
                extras.append(line)
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
    return events, extras


async def db_events(url: str, run_id: str) -> list[dict[str, Any]]:
    store = open_store(url)
    await store.open()
    try:
        return await store.read(service_events.run_events, run_id, 0, 10_000)
    finally:
        await store.close()


async def test_a_client_cut_off_mid_run_resumes_and_gets_every_event_once_in_order(
    store_url: str, tmp_path: Path
) -> None:
    env = Env(tmp_path, store_url)
    try:
        with served(settings_for(store_url)) as srv:
            h = await mint(srv.app, "t1", "alice", ["operator"], 3600)
            # Runs long enough (12 x 0.1 s) that the first worker to claim cannot finish
            # its three and take the other three before the second one's claims get
            # through, also on a loaded machine: both must commit.
            body = {"agent": "echo", "input": {"text": "x", "steps": 12, "pause": 0.1}}
            env.start_worker(app=APP, concurrency=3)
            env.start_worker(app=APP, concurrency=3)

            async def both_up() -> bool:
                return len(await srv.app.state.store.list_workers(live_within=30)) == 2

            await until(both_up, 60)
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
                ids = [
                    (await client.post("/v1/runs", json=body, headers=h)).json()["id"]
                    for _ in range(6)
                ]
                watched = ids[0]
                first, extras = await read_events(
                    client, f"/v1/runs/{watched}/events", h, stop_after=6
                )
                assert extras[0] == "retry: 2000"
                resume = {**h, "Last-Event-ID": str(first[-1]["id"])}
                rest, _ = await read_events(client, f"/v1/runs/{watched}/events", resume)
                got = first + rest
                assert got[-1]["type"] == "run.completed"
                # The run finished although the first client went away.
                for run_id in ids:
                    r = await client.get(f"/v1/runs/{run_id}/result?wait=30", headers=h)
                    assert r.status_code == 200 and r.json()["status"] == "completed"
                # Reconnecting after the end: the terminal event again, then the end.
                after_end = {**h, "Last-Event-ID": str(got[-1]["id"])}
                again, _ = await read_events(client, f"/v1/runs/{watched}/events", after_end)
                assert [e["type"] for e in again] == ["run.completed"]
                page = await client.get(
                    f"/v1/runs/{watched}/events?format=json&after=3&limit=4", headers=h
                )
                assert [e["seq"] for e in page.json()["events"]] == [4, 5, 6, 7]
        stored = await db_events(store_url, watched)
        assert [e["id"] for e in got] == list(range(1, len(stored) + 1))  # gapless, once each
        assert [e["type"] for e in got] == [e["type"] for e in stored]
        assert sum(e["type"] == "step.succeeded" for e in got) == 12
        owners = {e["actor"] for run_id in ids for e in await db_events(store_url, run_id)
                  if e["type"] == "run.claimed"}  # fmt: skip
        assert len(owners) == 2, "both worker processes committed"
    finally:
        env.close()


async def test_heartbeats_keep_an_idle_stream_open(tmp_path: Path) -> None:
    """Over real HTTP (the in-process transport buffers whole responses)."""
    with served(settings_for(f"sqlite:///{tmp_path / 'hb.db'}")) as srv:
        h = await mint(srv.app, "t1", "alice", ["operator"], 3600)
        lines: list[str] = []
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as client:
            run = (await client.post("/v1/runs", json={"agent": "free"}, headers=h)).json()

            async def read() -> None:
                async with client.stream("GET", f"/v1/runs/{run['id']}/events", headers=h) as r:
                    async for line in r.aiter_lines():
                        lines.append(line)
                        if line.startswith(": keep-alive"):
                            return

            await asyncio.wait_for(read(), timeout=10)
    assert lines[0] == "retry: 2000" and any(x.startswith("id: 1") for x in lines)


async def test_bad_last_event_id_is_400(sqlite_api: Api) -> None:
    h = await sqlite_api.key()
    run = (await sqlite_api.client.post("/v1/runs", json={"agent": "free"}, headers=h)).json()
    r = await sqlite_api.client.get(
        f"/v1/runs/{run['id']}/events", headers={**h, "Last-Event-ID": "abc"}
    )
    assert r.status_code == 400 and r.json()["type"].endswith("/bad-request")


@pytest.mark.parametrize("n", [3])
async def test_every_event_of_a_run_has_its_own_seq(sqlite_api: Api, n: int) -> None:
    """Submit, cancel and appended events all take the run's next seq."""
    h = await sqlite_api.key()
    run = (await sqlite_api.client.post("/v1/runs", json={"agent": "free"}, headers=h)).json()
    for i in range(n):
        await sqlite_api.store.append_event(run["id"], f"note.{i}", "test", None)
    await sqlite_api.client.post(f"/v1/runs/{run['id']}/cancel", headers=h)

    async def done() -> bool:
        r = await sqlite_api.client.get(f"/v1/runs/{run['id']}/events?format=json", headers=h)
        return bool(r.json()["end"])

    await until(done)
    page = (
        await sqlite_api.client.get(f"/v1/runs/{run['id']}/events?format=json", headers=h)
    ).json()
    # run.submitted, run.accepted, the notes, run.cancelled
    assert [e["seq"] for e in page["events"]] == list(range(1, n + 4))
    assert page["events"][-1]["type"] == "run.cancelled"
