"""A decision whose early check passes but which reaches the store after expiry: 410,
nothing recorded, and the expiry's default decides the run (on each backend)."""

from __future__ import annotations

import time

from agentledger.clock import Clock
from tests.service.conftest import in_process, settings_for
from tests.service.test_approvals_api import parked
from tests.service.test_runs_api import assert_problem


class SlowRequestClock(Clock):
    """The service's clock as a request slowed between its check and its write sees it:
    the first reading (the router's early check) is a millisecond before expiry; every
    later one (the store's, inside the transaction that records the decision) waits
    until the real clock has passed expiry and returns it."""

    def __init__(self, expires_at: float) -> None:
        self.expires_at = expires_at
        self.readings: list[float] = []

    def now(self) -> float:
        if not self.readings:
            value = self.expires_at - 0.001
        else:
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
        run = await parked(api, gina, {"role": "guest", "expires_in": 3.0})
        approval = run["pending_approval"]
        listed = (await api.client.get("/v1/approvals", headers=gina)).json()["approvals"]
        body = {"decision": "approve", "arguments_hash": listed[0]["arguments_hash"]}
        clock = SlowRequestClock(approval["expires_at"])
        api.app.state.clock = clock
        url = f"/v1/approvals/{approval['id']}/decision"
        assert_problem(await api.client.post(url, json=body, headers=gina), 410, "expired")
        # The early check passed; the store read the clock again, past expiry, and refused.
        assert len(clock.readings) == 2, clock.readings
        assert clock.readings[0] < approval["expires_at"] <= clock.readings[1]

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
