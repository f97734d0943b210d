"""A webhook body describes the run as it was at its event, not when the event was sealed.

Bodies are built when the sealer chains the event, about a second after it; here the
seal is driven by hand, after the run has moved on (handed over, resumed, completed).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agentledger import App, WorkflowContext
from agentledger import _sealer as sealer
from agentledger._budget import Budget
from agentledger.observe._queries import resume as observe_resume
from agentledger.observe._queries.stuck import StuckRun, mark_stuck
from agentledger.service._queries import webhooks as service_webhooks
from tests.loopback_http import QuietHandler, serving
from tests.service.conftest import Api, in_process, settings_for, until

HAND_OVER = {"now": True}  # read by the workflow's first step (same process)

app = App("webhook-state-tests")


async def _check() -> bool:
    return HAND_OVER["now"]


async def _noop() -> str:
    return "ok"


@app.workflow(name="over_then_done", version="1", budget=Budget(max_steps=1))
async def over_then_done(ctx: WorkflowContext, input: Any) -> Any:
    """Over its one-step budget (handed to a human) while ``HAND_OVER``; else done."""
    if await ctx.step("check", _check):
        await ctx.step("more", _noop)
    return {"done": True}


class Received:
    """What the loopback receiver was sent: event type -> body (answers 200)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def of(self, run_id: str) -> dict[str, dict[str, Any]]:
        with self.lock:
            return {b["type"]: b for b in self.bodies if b["run_id"] == run_id}


@pytest.fixture
def receiver() -> Iterator[tuple[Received, str]]:
    got = Received()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with got.lock:
                got.bodies.append(json.loads(body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as url:
        yield got, url


NO_SEALER = {"audit_seal_every": 3600, "webhook_poll": 0.05, "webhook_backoff": 0.05}


async def sealed_count(api: Api, run_id: str) -> int:
    rows = await api.store.read(lambda tx: tx.dialect.fetchall(
            # The accept's own events are chained at insert on SQLite (they raise no
            # webhook): the count is of what the run wrote after.
            tx.conn, "SELECT COUNT(*) AS n FROM events WHERE run_id = :id AND hash IS NOT NULL "
            "AND type NOT IN ('run.submitted', 'run.accepted')",
            {"id": run_id},
        ))  # fmt: skip
    return int(rows[0]["n"])


async def test_a_handover_resumed_and_completed_before_the_seal_is_reported_as_it_was(
    receiver: tuple[Received, str], store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    got, url = receiver
    monkeypatch.setenv(sealer.PERIOD_ENV, "3600")  # the inline worker's sealer: not now
    monkeypatch.setitem(HAND_OVER, "now", True)
    settings = settings_for(store_url, workers_inline=1, **NO_SEALER)
    async with in_process(settings, app) as api:
        h = await api.key("t1", "olga", ("operator",))
        body = {"agent": "over_then_done", "input": {}, "webhook": url}
        run_id = (await api.client.post("/v1/runs", json=body, headers=h)).json()["id"]

        async def status_is(status: str) -> bool:
            r = await api.client.get(f"/v1/runs/{run_id}", headers=h)
            return bool(r.json()["status"] == status)

        await until(lambda: status_is("needs_human"))
        handed_over = (await api.client.get(f"/v1/runs/{run_id}", headers=h)).json()
        assert handed_over["handover_reason"]
        HAND_OVER["now"] = False
        await api.store.transact(observe_resume.resume_run, run_id, 1, "ops", "budget raised")
        await until(lambda: status_is("completed"))
        assert await sealed_count(api, run_id) == 0  # nothing sealed, nothing enqueued yet
        assert await api.store.transact(service_webhooks.deliveries) == []

        assert await sealer.seal_once(api.store) > 0

        async def both() -> bool:
            return {"run.needs_human", "run.completed"} <= set(got.of(run_id))

        await until(both, 30)
        bodies = got.of(run_id)
        needs_human, completed = bodies["run.needs_human"], bodies["run.completed"]
        assert needs_human["run"] == {
            "status": "needs_human",
            "result": None,
            "error": handed_over["error"],
            "handover_reason": handed_over["handover_reason"],
        }
        assert needs_human["data"]["reason"] == "budget" and "run" not in needs_human["data"]
        assert completed["run"] == {
            "status": "completed",
            "result": {"done": True},
            "error": None,
            "handover_reason": None,
        }


async def test_older_events_fall_back_to_the_row_only_while_it_holds_their_status(
    sqlite_api: Api,
) -> None:
    """Ending events written before their data recorded the run, and a ``run.stuck``
    event whose run has since completed."""
    api = sqlite_api
    h = await api.key("t1", "olga", ("operator",))
    hook = "http://127.0.0.1:9/hook"  # never answered: the bodies are read from the store
    ids = []
    for _ in range(3):
        body = {"agent": "free", "input": {}, "webhook": hook}  # no worker: stays queued
        ids.append((await api.client.post("/v1/runs", json=body, headers=h)).json()["id"])
    kept, moved, stuck = ids

    def set_row(run_id: str, status: str, result: str | None, error: str | None,
                reason: str | None) -> Any:  # fmt: skip
        return api.store.transact(
            lambda tx: tx.execute(
                "UPDATE runs SET status = :s, result = :r, error = :e, handover_reason = :h "
                "WHERE id = :id", {"s": status, "r": result, "e": error, "h": reason, "id": run_id},
            )
        )  # fmt: skip

    old_data = {"reason": "budget", "detail": "over budget", "steps": 2}
    for run_id in (kept, moved):
        await set_row(run_id, "needs_human", None, "sorry", "over budget")
        await api.store.append_event(run_id, "run.handover", "w1", old_data)
    await set_row(moved, "completed", '{"done": true}', None, None)  # resumed since
    marked = StuckRun(stuck, "free", "1", "t1", "queued", "no_worker", 1.0, 60.0, 0, False)
    assert await api.store.transact(mark_stuck, marked, "checker")
    await set_row(stuck, "completed", '{"done": true}', None, None)

    await sealer.seal_once(api.store)
    rows = await api.store.transact(service_webhooks.deliveries)
    bodies = {r["run_id"]: json.loads(r["body"]) for r in rows}
    assert bodies[kept]["run"] == {
        "status": "needs_human",
        "result": None,
        "error": "sorry",
        "handover_reason": "over budget",
    }
    assert bodies[moved]["run"] == {
        "status": "needs_human",
        "result": None,
        "error": None,
        "handover_reason": None,
    }
    assert bodies[stuck]["type"] == "run.stuck"
    assert bodies[stuck]["run"] == {
        "status": "queued",
        "result": None,
        "error": None,
        "handover_reason": None,
    }
