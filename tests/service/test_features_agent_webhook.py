"""Per-agent webhooks: a run started without a URL reports to its agent's webhook."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from agentledger import App, WorkflowContext
from agentledger.service import create_app
from agentledger.service._auth import create_key
from agentledger.service._queries import webhooks as service_webhooks
from agentledger.service._webhooks import verify
from tests.service.conftest import PEPPER, settings_for, until
from tests.service.test_webhooks import FAST, Receiver, receiver  # noqa: F401 (fixture)

app = App("agent-webhook-tests")
HOOK: dict[str, str] = {}


@app.workflow(name="hooked", version="1", webhook="http://unused.invalid/replaced-in-test")
async def hooked(ctx: WorkflowContext, input: Any) -> Any:
    """Returns its input; its events go to the workflow's webhook."""
    return input


@app.workflow(name="plain", version="1")
async def plain(ctx: WorkflowContext, input: Any) -> Any:
    """No webhook of its own: one only from the deployment's setting."""
    return input


@contextlib.asynccontextmanager
async def service(db: str, **extra: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    api = create_app(settings_for(db, **FAST, **extra), app)
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield api, client


async def test_runs_report_to_their_agents_webhook(
    receiver: tuple[Receiver, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    rec, url = receiver
    app.get("hooked", "1").webhook = url  # type: ignore[union-attr]
    db = f"sqlite:///{tmp_path / 'hooks.db'}"
    async with service(db, agent_webhooks={"plain": url + "?from=setting"}) as (api, client):
        full, _ = await create_key(api.state.store, PEPPER, "t1", "gina", ["guest"], 3600)
        h = {"Authorization": f"Bearer {full}"}
        secret = await api.state.store.transact(service_webhooks.webhook_secret, "t1")
        a = (await client.post("/v1/runs", json={"agent": "hooked", "input": 1}, headers=h)).json()
        b = (await client.post("/v1/runs", json={"agent": "plain", "input": 2}, headers=h)).json()

        async def both_in() -> bool:
            return len(rec.delivered()) >= 2

        await until(both_in, 30)
        got = {json.loads(x["body"])["run_id"]: x for x in rec.delivered().values()}
        assert set(got) == {a["id"], b["id"]}
        for delivery in got.values():
            assert delivery["headers"]["AgentLedger-Event"] == "run.completed"
            assert verify(secret, delivery["headers"]["AgentLedger-Signature"], delivery["body"])
            # Retried like per-run webhooks, with the same event id.
            tries = [x for x in rec.attempts if x["id"] == delivery["id"]]
            assert [x["status"] for x in tries] == [500, 500, 200]
        assert json.loads(got[b["id"]]["body"])["run"]["result"] == 2
        # The URL is fixed on the run when accepted: the setting wins over no attribute.
        urls = await api.state.store.transact(
            lambda tx: {r["id"]: r["webhook"] for r in tx.fetchall("SELECT id, webhook FROM runs")}
        )
        assert urls == {a["id"]: url, b["id"]: url + "?from=setting"}
