"""``GET /v1/runs/{id}`` says whether a run's tokens and cost were simulated (a scripted
model answered: nobody counted or billed them), as `runs show` does, and
``/openapi.json`` publishes that field with the rest of the run; the console's run page
marks the cost too (issue 22)."""

from __future__ import annotations

import re
from pathlib import Path

from agentledger import Agent, App, ScriptedModel, Turn
from agentledger.records import RunStatus
from agentledger.service._views import RunView
from tests.fast.lifecycle_harness import Harness
from tests.service.conftest import in_process, settings_for
from tests.service.test_console_http import browser

_COST = re.compile(r"<dt>Cost</dt><dd>([^<]*)</dd>")


def _app() -> App:
    app = App("simulated")
    app.add_agent(
        Agent(name="helper", model=ScriptedModel([Turn(text="done")]), instructions="Help.")
    )
    return app


async def test_get_run_says_whether_its_tokens_and_cost_were_simulated(
    store_url: str, tmp_path: Path
) -> None:
    async with Harness(tmp_path, _app(), store_url) as h:
        run = await h.drive(await h.submit("helper", "hi"))
    assert run.status == RunStatus.COMPLETED and run.tokens > 0 and run.usage_simulated
    async with in_process(settings_for(store_url)) as api:
        viewer = await api.key(tenant=run.tenant_id, roles=("viewer",))
        simulated = (await api.client.get(f"/v1/runs/{run.id}", headers=viewer)).json()
        operator = await api.key(tenant=run.tenant_id)
        submitted = await api.client.post("/v1/runs", json={"agent": "free"}, headers=operator)
        assert submitted.status_code == 202, submitted.text
        assert submitted.json()["usage_simulated"] is False
        other = submitted.json()["id"]
        real = (await api.client.get(f"/v1/runs/{other}", headers=viewer)).json()
        listed = (await api.client.get("/v1/runs", headers=viewer)).json()["runs"]
        spec = (await api.client.get("/openapi.json")).json()
        async with browser(api, viewer) as page:  # the console's run page says it too
            costs = [_COST.findall((await page.get(f"/ui/runs/{r}")).text) for r in (run.id, other)]
    assert [len(c) == 1 and c[0].endswith(" (simulated)") for c in costs] == [True, False], costs
    assert simulated["tokens"] == run.tokens and simulated["usage_simulated"] is True
    assert real["usage_simulated"] is False
    assert {r["id"]: r["usage_simulated"] for r in listed} == {run.id: True, other: False}
    # The published model and the answer hold the same fields, each of the type given.
    for body in (simulated, real):
        assert set(body) == set(RunView.model_fields), set(body) ^ set(RunView.model_fields)
        RunView.model_validate(body, strict=True)
    answer = spec["paths"]["/v1/runs/{run_id}"]["get"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RunView"
    }, answer
    field = spec["components"]["schemas"]["RunView"]["properties"]["usage_simulated"]
    assert field["type"] == "boolean" and "simulated" in field["description"], field
