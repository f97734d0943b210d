"""``/metrics`` and ``/v1/stats`` on the service, through the ASGI app in process."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentledger.app import App
from agentledger.service.app import create_app
from agentledger.service.settings import ServiceSettings
from agentledger.store import NewRun, open_store


async def test_metrics_and_stats_are_served(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    store = open_store(url)
    await store.open()
    try:
        for _ in range(3):
            await store.create_run(NewRun(kind="workflow", name="w", version="1", input={}))
        api = create_app(ServiceSettings(db_url=url, pepper=b"p" * 32), App("t"), store=store)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
            response = await client.get("/metrics")
            assert response.status_code == 200
            families = {f.name: f for f in text_string_to_metric_families(response.text)}
            queued = [
                s.value
                for s in families["agentledger_runs"].samples
                if s.labels.get("status") == "queued"
            ]
            assert queued == [3.0]
            response = await client.get("/v1/stats")
            assert response.status_code == 401
            assert response.headers["content-type"].startswith("application/problem+json")
    finally:
        await store.close()
