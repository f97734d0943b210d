"""A decision sent before expiry but reaching the store after it: 410, nothing recorded,
and the expiry's default decides the run (on each backend). Expiry is judged by the
store alone, on the service's clock read while the row is held."""

from __future__ import annotations

import time

from agentledger._clock import Clock
from tests.service.conftest import in_process, settings_for
from tests.service.test_approvals_api import parked
from tests.service.test_runs_api import assert_problem


class SlowRequestClock(Clock):
    """The service's clock as a request slowed on its way to the store sees it: every
    reading waits until the real clock has passed expiry and returns it."""

    def __init__(self, expires_at: float) -> None:
        self.expires_at = expires_at
        self.readings: list[float] = []

    def now(self) -> float:
        deadline = time.monotonic() + 60
        while time.time() <= self.expires_at and time.monotonic() < deadline:
            time.sleep(0.01)
        value = time.time()
        self.readings.append(value)
        return value


async def test_a_decision_written_after_expiry_is_410_and_the_run_ends_rejected(
    store_url: str,
) -> None:
    async with in_process(settings_for(store_url, workers_inline=1)) as api:
        gina = await api.key("t1", "gina", ("guest",))
        # Ten seconds to see the approval parked and send the decision before it expires
        # (3 s were used up by a loaded machine: the decision was sent after expiry).
        run = await parked(api, gina, {"role": "guest", "expires_in": 10.0})
        approval = run["pending_approval"]
        listed = (await api.client.get("/v1/approvals", headers=gina)).json()["approvals"]
        body = {"decision": "approve", "arguments_hash": listed[0]["arguments_hash"]}
        clock = SlowRequestClock(approval["expires_at"])
        api.app.state.clock = clock
        url = f"/v1/approvals/{approval['id']}/decision"
        sent = time.time()
        assert_problem(await api.client.post(url, json=body, headers=gina), 410, "expired")
        # Sent before expiry; the store read the clock, past expiry, and refused.
        assert sent < approval["expires_at"] <= clock.readings[0], (sent, clock.readings)
        assert len(clock.readings) == 1, clock.readings

        done = await api.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=gina)
        assert done.json()["status"] == "failed", done.json()
        assert "rejected by system:expired" in done.json()["error"]
        shown = (await api.client.get(f"/v1/runs/{run['id']}", headers=gina)).json()
        (decided,) = [a for a in await api.store.get_approvals(run["id"])]
        assert (decided.decision, decided.decided_by) == ("reject", "system:expired")
        assert decided.approvers == []
        events = [e.type for e in await api.store.list_events(run["id"])]
        assert "approval.decision_context" not in events
        assert shown["status"] == "failed"
        steps = (await api.client.get(f"/v1/runs/{run['id']}/steps", headers=gina)).json()
        assert not [s for s in steps["steps"] if s["name"] == "pay" and s["status"] == "succeeded"]
