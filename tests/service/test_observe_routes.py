"""``/metrics`` and ``/v1/stats`` on the service, through the ASGI app in process: both
are closed to tenants (issue 19, point 11). ``/metrics`` on the API port needs a key with
the deployment-wide role; ``/v1/stats`` counts the caller's tenant only, unless its key
holds that role."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import Api


def _queued(text: str) -> list[float]:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return [
        s.value for s in families["agentledger_runs"].samples if s.labels.get("status") == "queued"
    ]


async def _runs(api: Api, headers: dict[str, str], n: int, agent: str = "free") -> None:
    for _ in range(n):
        body = {"agent": agent, "input": {"text": "x"}}
        reply = await api.client.post("/v1/runs", json=body, headers=headers)
        assert reply.status_code == 202, reply.text


async def test_metrics_need_a_deployment_key_on_the_api_port(api: Api) -> None:
    await _runs(api, await api.key("a"), 3)
    reply = await api.client.get("/metrics")
    assert reply.status_code == 401
    assert reply.headers["content-type"].startswith("application/problem+json")
    assert "tenant" not in reply.text and "agentledger_runs" not in reply.text
    admin = await api.key("a", "root", ("admin",))
    reply = await api.client.get("/metrics", headers=admin)
    assert reply.status_code == 403, reply.text  # a tenant's admin is not the deployment's
    reply = await api.client.get("/metrics", headers=await api.key("ops", "prom", ("deployment",)))
    assert reply.status_code == 200
    assert _queued(reply.text) == [3.0]


async def test_stats_count_the_callers_tenant_only(api: Api) -> None:
    await _runs(api, await api.key("a"), 3)
    await _runs(api, await api.key("b"), 2, agent="echo")

    async def stats(headers: dict[str, str], query: str = "") -> Any:
        reply = await api.client.get(f"/v1/stats{query}", headers=headers)
        assert reply.status_code == 200, reply.text
        return reply.json()

    b = await stats(await api.key("b", "root", ("admin",)))
    assert (b["runs"], b["by_status"], b["tenant"]) == (2, {"queued": 2}, "b")
    a = await stats(await api.key("a", "root", ("admin",)))
    assert (a["runs"], a["tenant"]) == (3, "a")
    # A tenant's admin cannot widen the scope; the deployment role can.
    reply = await api.client.get("/v1/stats?tenant=a", headers=await api.key("b", "r", ("admin",)))
    assert reply.status_code == 403
    ops = await api.key("ops", "prom", ("deployment",))
    everything = await stats(ops)
    assert (everything["runs"], everything["tenant"]) == (5, None)
    assert (await stats(ops, "?tenant=b"))["runs"] == 2
    # Deployment keys read; they do not act for a tenant's admin.
    assert (await api.client.get("/v1/audit", headers=ops)).status_code == 403


async def test_a_deployment_key_reads_figures_and_starts_nothing(api: Api) -> None:
    """The deployment role is a monitoring credential (a Prometheus scrape config holds
    it): it reads deployment-wide figures, but is no writer in its own tenant."""
    ops = await api.key("ops", "prom", ("deployment",))
    reply = await api.client.post("/v1/runs", json={"agent": "free", "input": {}}, headers=ops)
    assert reply.status_code == 403, reply.text
    assert "deployment" in reply.json()["detail"]
    assert (await api.client.get("/v1/stats", headers=ops)).json()["runs"] == 0
    # With a writing role beside it, the same key starts runs as that role allows.
    both = await api.key("ops", "prom", ("deployment", "operator"))
    reply = await api.client.post("/v1/runs", json={"agent": "free", "input": {}}, headers=both)
    assert reply.status_code == 202, reply.text


async def test_metrics_without_the_metrics_extra_say_what_to_install(
    api: Api, monkeypatch: Any
) -> None:
    from agentledger import _extras as extras

    real = extras.installed
    monkeypatch.setattr(extras, "installed", lambda m: m != "prometheus_client" and real(m))
    reply = await api.client.get("/metrics", headers=await api.key("ops", "prom", ("deployment",)))
    assert reply.status_code == 404, reply.text
    assert "pip install 'agentledger[metrics]'" in reply.json()["detail"]
