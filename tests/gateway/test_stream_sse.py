"""Model tokens on the service's SSE stream, over real HTTP: from a worker inside the
service process (SQLite, PostgreSQL) and from a worker in another process (PostgreSQL
NOTIFY). A delta frame has no ``id:``; the journaled events stay gapless and resumable."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from agentledger import App
from agentledger.service import create_app
from agentledger.store import open_store
from tests.engine.helpers import Env
from tests.gateway import worker_app
from tests.gateway.fakes import FakeProviders, openai_stream
from tests.service.conftest import free_port, mint, settings_for

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WORKER_APP = "tests.gateway.worker_app:app"


@contextlib.contextmanager
def served(url: str, app: App, workers_inline: int) -> Iterator[tuple[str, Any]]:
    """The service under uvicorn on a loopback port (its own thread and loop)."""
    api = create_app(settings_for(url, workers_inline=workers_inline), app)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))

    def run() -> None:
        async def main() -> None:
            try:
                await server.serve()
            finally:  # the SDK clients of inline workers live on this loop
                await _close_models(app)

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{port}", api
    finally:
        server.should_exit = True
        thread.join(timeout=30)


async def frames(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The stream's frames: ``{"id": int | None, "event": str, "data": dict}``."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in fields:
                yield {
                    "id": int(fields["id"]) if "id" in fields else None,
                    "event": fields["event"],
                    "data": json.loads(fields["data"]),
                }
            fields = {}
        elif not line.startswith((":", "retry:")):
            name, _, value = line.partition(": ")
            fields[name] = value


async def model_step_status(url: str, run_id: str) -> str | None:
    store = open_store(url)
    await store.open()
    try:
        steps = [s for s in await store.load_journal(run_id) if s.kind == "model"]
        return str(steps[0].status) if steps else None
    finally:
        await store.close()


async def stored_events(url: str, run_id: str) -> list[Any]:
    store = open_store(url)
    await store.open()
    try:
        return list(await store.list_events(run_id))
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("backend", "workers"),
    [
        ("sqlite", "inline"),
        pytest.param("postgres", "process", marks=pytest.mark.postgres),
        pytest.param("postgres", "inline", marks=pytest.mark.postgres),
    ],
)
async def test_tokens_reach_the_sse_stream_without_ids_while_the_model_answers(
    backend: str,
    workers: str,
    fake: FakeProviders,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = (
        str(request.getfixturevalue("pg_url"))
        if backend == "postgres"
        else f"sqlite:///{tmp_path / 'svc.db'}"
    )
    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    begin, middle, end = threading.Event(), threading.Event(), threading.Event()
    reply = openai_stream(["Three ", "hotels."])
    assert reply.sse is not None
    first, second, *rest = reply.sse
    reply.sse = [begin, first, middle, second, end, *rest]
    fake.script(reply)
    env = Env(tmp_path, url)
    app = worker_app.make_app()  # built now: streaming is on in this environment
    try:
        with served(url, app, workers_inline=1 if workers == "inline" else 0) as (base, api):
            if workers == "process":
                env.start_worker(app=WORKER_APP, concurrency=2)
            h = await mint(api, "t1", "alice", ["operator"], 3600)
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                body = {"agent": "concierge", "input": {"message": "Hotels in Lisbon?"}}
                created = await client.post("/v1/runs", json=body, headers=h)
                assert created.status_code in (200, 201, 202), created.text
                run_id = created.json()["id"]
                await asyncio.to_thread(fake.wait_requests, 1, 60)  # the call is in flight
                got: list[dict[str, Any]] = []
                try:
                    async with (
                        asyncio.timeout(60),  # a bound on a hang, not a measurement
                        client.stream("GET", f"/v1/runs/{run_id}/events", headers=h) as r,
                    ):
                        assert r.status_code == 200
                        async for f in frames(r):
                            got.append(f)
                            if len(got) == 1:
                                begin.set()  # the stream is up: let the model speak
                            text = f["data"].get("text") if f["event"] == "model.delta" else None
                            if text == "Three ":
                                # Live: the answer is not journaled yet.
                                assert await model_step_status(url, run_id) == "started"
                                middle.set()
                            elif text == "hotels.":
                                end.set()
                            if f["event"] == "run.completed":
                                break
                except TimeoutError:
                    raise AssertionError(f"the stream never completed; it sent {got}") from None
                deltas = [f for f in got if f["event"] == "model.delta"]
                journaled = [f for f in got if f["event"] != "model.delta"]
                assert [d["data"]["text"] for d in deltas] == ["Three ", "hotels."]  # once each
                assert all(d["id"] is None for d in deltas)
                assert {d["data"]["run_id"] for d in deltas} == {run_id}
                assert {d["data"]["step_no"] for d in deltas} == {1}
                # The journaled events: every one once, gapless, as stored, no delta among them.
                stored = await stored_events(url, run_id)
                assert [f["id"] for f in journaled] == list(range(1, len(stored) + 1))
                assert [f["event"] for f in journaled] == [e.type for e in stored]
                assert "model.delta" not in {e.type for e in stored}
                # A reconnect after the first delta resumes at the journaled event after
                # the last id seen: the deltas never moved Last-Event-ID.
                before = max(f["id"] for f in got[: got.index(deltas[0])] if f["id"] is not None)
                resume = {**h, "Last-Event-ID": str(before)}
                async with client.stream("GET", f"/v1/runs/{run_id}/events", headers=resume) as r:
                    again = [f async for f in frames(r)]
                assert [f["id"] for f in again] == [f["id"] for f in journaled if f["id"] > before]
                result = await client.get(f"/v1/runs/{run_id}/result?wait=30", headers=h)
                assert result.json()["result"] == {"answer": "Three hotels."}
    finally:
        begin.set(), middle.set(), end.set()
        env.close()


async def _close_models(app: App) -> None:
    for definition in app.definitions.values():
        closer = getattr(getattr(definition, "model", None), "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()
