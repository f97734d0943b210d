"""Streams are woken by commits, not only by the hub's poll: after each journal commit of
the serving process (inline workers), and on PostgreSQL by the notification every journal
group commit sends (workers in other processes). The hub's poll period here is an hour,
so a stream that gets its run's events to the end was woken by commits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.engine.helpers import Env
from tests.service.conftest import mint, served, settings_for
from tests.service.test_events_stream import db_events, read_events

APP = "tests.service.service_app:app"
HOUR = 3600.0
BODY = {"agent": "echo", "input": {"text": "x", "steps": 6, "pause": 0.02}}


async def _stream_to_the_end(base_url: str, headers: dict[str, str], run_id: str) -> list[int]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        got, _ = await asyncio.wait_for(
            read_events(client, f"/v1/runs/{run_id}/events", headers), 90
        )
    assert got[-1]["type"] == "run.completed"
    return [e["id"] for e in got]


async def test_inline_workers_commits_wake_the_streams(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wake.db'}"
    with served(settings_for(url, event_poll=HOUR, workers_inline=1)) as srv:
        h = await mint(srv.app, "t1", "alice", ["operator"], 3600)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
            run_id = (await client.post("/v1/runs", json=BODY, headers=h)).json()["id"]
        ids = await _stream_to_the_end(srv.base_url, h, run_id)
    stored = await db_events(url, run_id)
    assert ids == list(range(1, len(stored) + 1))  # every event once, in order


async def test_postgres_notifications_wake_the_streams(pg_url: str, tmp_path: Path) -> None:
    env = Env(tmp_path, pg_url)
    try:
        with served(settings_for(pg_url, event_poll=HOUR)) as srv:
            h = await mint(srv.app, "t1", "alice", ["operator"], 3600)
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
                run_id = (await client.post("/v1/runs", json=BODY, headers=h)).json()["id"]
            stream = asyncio.ensure_future(_stream_to_the_end(srv.base_url, h, run_id))
            env.start_worker(app=APP, concurrency=2)  # another process: only NOTIFY wakes
            ids = await stream
        stored = await db_events(pg_url, run_id)
        assert ids == list(range(1, len(stored) + 1))
    finally:
        env.close()
