"""A decision sent before expiry but reaching the store after it: 410, nothing recorded,
and the expiry's default decides the run (on each backend). Expiry is judged by the
store alone, on the service's clock read while the row is held."""

from __future__ import annotations

import time

from agentledger._clock import Clock
from tests.service.conftest import FIRST_TTL, in_process, pending_in_time, settings_for
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

        ttls: list[float] = []

        async def start(ttl: float) -> str:
            ttls.append(ttl)
            ask = {"role": "guest", "expires_in": ttl}
            body = {"agent": "payout", "input": {"amount": 120, "approval": ask}}
            return str((await api.client.post("/v1/runs", json=body, headers=gina)).json()["id"])

        while True:
            # The decision must be sent before expiry: a run whose approval a loaded
            # machine let expire first is followed by one with a longer time to live.
            run = await pending_in_time(api, gina, start, 2 * ttls[-1] if ttls else FIRST_TTL)
            approval = run["pending_approval"]
            listed = (await api.client.get("/v1/approvals", headers=gina)).json()["approvals"]
            hashed = [a["arguments_hash"] for a in listed if a["id"] == approval["id"]]
            if not hashed:
                continue  # expired before it was listed
            body = {"decision": "approve", "arguments_hash": hashed[0]}
            url = f"/v1/approvals/{approval['id']}/decision"
            sent = time.time()
            if sent < approval["expires_at"]:
                break
        clock = SlowRequestClock(approval["expires_at"])
        api.app.state.clock = clock
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
