"""A run's ending event carries its result (``data.run``): a result of megabytes, and one
nested as deep as the journal allows, still end the run, are sealed into the audit
chain, verify, and reach the webhook receiver whole (on each backend)."""

from __future__ import annotations

from typing import Any

import pytest

from agentledger import App, WorkflowContext
from agentledger import _sealer as sealer
from agentledger._canonical import MAX_DEPTH
from agentledger.service._queries import audit as service_audit
from tests.service.conftest import in_process, settings_for, until
from tests.service.test_webhook_event_state import NO_SEALER, Received, receiver  # noqa: F401

BIG = "x" * (3 * 1024 * 1024)

app = App("big-result-tests")


def deep() -> Any:
    """A list nested exactly as deep as a journaled value may be."""
    value: Any = 1
    for _ in range(MAX_DEPTH):
        value = [value]
    return value


@app.workflow(name="big", version="1")
async def big(ctx: WorkflowContext, input: Any) -> Any:
    """A result of megabytes."""
    return {"blob": BIG}


@app.workflow(name="deep", version="1")
async def deep_flow(ctx: WorkflowContext, input: Any) -> Any:
    """A result at the journal's depth limit (the event nests it two levels deeper)."""
    return deep()


async def test_huge_and_deep_results_are_ended_sealed_and_delivered(
    receiver: tuple[Received, str],  # noqa: F811
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got, url = receiver
    monkeypatch.setenv(sealer.PERIOD_ENV, "3600")
    settings = settings_for(store_url, workers_inline=1, **NO_SEALER)
    async with in_process(settings, app) as api:
        h = await api.key("t1", "olga", ("operator",))
        ids = {}
        for name in ("big", "deep"):
            body = {"agent": name, "input": {}, "webhook": url}
            ids[name] = (await api.client.post("/v1/runs", json=body, headers=h)).json()["id"]

        async def ended() -> bool:
            for run_id in ids.values():
                r = await api.client.get(f"/v1/runs/{run_id}", headers=h)
                if r.json()["status"] != "completed":
                    return False
            return True

        await until(ended, 60)
        assert await sealer.seal_once(api.store) > 0
        checked, broken = await api.store.read(service_audit.verify_chain)
        assert checked > 0 and broken == []

        async def delivered() -> bool:
            return all("run.completed" in got.of(run_id) for run_id in ids.values())

        await until(delivered, 60)
        big_body = got.of(ids["big"])["run.completed"]
        assert big_body["run"]["result"] == {"blob": BIG}
        assert "run" not in big_body["data"]
        assert got.of(ids["deep"])["run.completed"]["run"]["result"] == deep()
        events = await api.client.get(
            f"/v1/runs/{ids['deep']}/events", params={"format": "json"}, headers=h
        )
        (ending,) = [e for e in events.json()["events"] if e["type"] == "run.completed"]
        assert ending["data"]["run"]["status"] == "completed"
        assert "result" not in ending["data"]["run"]  # kept once, in the run's row
