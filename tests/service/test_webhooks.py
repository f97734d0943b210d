"""Signed webhooks through a loopback receiver that fails its first two deliveries."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentledger.service._queries import webhooks as service_webhooks
from agentledger.service._webhooks import verify
from tests.loopback_http import QuietHandler, serving
from tests.service.conftest import in_process, pending_in_time, settings_for, until


class Receiver:
    """Records every delivery; answers 500 to the first ``fail_first`` of each event id."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.attempts: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            event_id = headers.get("AgentLedger-Event-Id", "")
            tries = sum(1 for a in self.attempts if a["id"] == event_id)
            status = 500 if tries < self.fail_first else 200
            self.attempts.append(
                {"id": event_id, "headers": headers, "body": body, "status": status}
            )
            return status

    def delivered(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return {a["id"]: a for a in self.attempts if a["status"] == 200}


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    rec = Receiver(fail_first=2)

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = rec.handle(dict(self.headers.items()), body)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as url:
        yield rec, url


FAST = {"workers_inline": 1, "audit_seal_every": 0.05, "webhook_poll": 0.05,
        "webhook_backoff": 0.05}  # fmt: skip
# An approval's time to live when its approval.expiring warning is awaited. The warning is
# enqueued only by a dispatcher pass inside the last fifth of that life (never once it
# expired), which a pass stalled by a loaded machine can miss: a run whose warning was
# missed is followed by one whose approval lives twice as long, up to the last time to
# live, past which a missing warning is a failure.
FIRST_WARNED_TTL = 2.0
LAST_WARNED_TTL = 16.0


async def test_each_event_arrives_signed_despite_two_failed_deliveries(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    rec, url = receiver
    db = f"sqlite:///{tmp_path / 'hooks.db'}"
    async with in_process(settings_for(db, **FAST)) as api:
        h = await api.key("t1", "gina", ("guest",))
        secret = await api.store.transact(service_webhooks.webhook_secret, "t1")
        done = await api.client.post(
            "/v1/runs", json={"agent": "free", "input": {"x": 1}, "webhook": url}, headers=h
        )
        run_a, ttl = done.json()["id"], FIRST_WARNED_TTL
        while True:
            run_b = (await start_payout(api, h, url, ttl))["id"]

            async def failed_and_reported(run_id: str = run_b) -> bool:
                return any(
                    a["status"] == 200 and json.loads(a["body"])["run_id"] == run_id
                    and a["headers"]["AgentLedger-Event"] == "run.failed"
                    for a in rec.attempts
                )  # fmt: skip

            await until(failed_and_reported, 60)
            if any(json.loads(a["body"])["run_id"] == run_b
                   and a["headers"]["AgentLedger-Event"] == "approval.expiring"
                   for a in rec.attempts):  # fmt: skip
                break
            # No dispatcher pass fell inside the last fifth of the approval's life (a
            # loaded machine): the next run's approval lives twice as long.
            assert ttl < LAST_WARNED_TTL, f"no warning within a time to live of {ttl} s"
            ttl *= 2

        def ours() -> dict[str, dict[str, Any]]:
            return {
                event_id: a for event_id, a in rec.delivered().items()
                if json.loads(a["body"])["run_id"] in (run_a, run_b)
            }  # fmt: skip

        async def all_in() -> bool:
            return len(ours()) >= 4

        await until(all_in, 30)
        got = ours()
        types = {json.loads(a["body"])["run_id"] + ":" + a["headers"]["AgentLedger-Event"]
                 for a in got.values()}  # fmt: skip
        assert types == {
            f"{run_a}:run.completed",
            f"{run_b}:approval.needed",
            f"{run_b}:approval.expiring",
            f"{run_b}:run.failed",  # rejected by default on expiry, the run ends cleanly
        }
        for event_id, ok in got.items():
            tries = [a for a in rec.attempts if a["id"] == event_id]
            assert [a["status"] for a in tries] == [500, 500, 200]  # retried, same event id
            assert len({a["body"] for a in tries}) == 1
            assert verify(secret, ok["headers"]["AgentLedger-Signature"], ok["body"])
            assert not verify("whsec_wrong", ok["headers"]["AgentLedger-Signature"], ok["body"])
            assert json.loads(ok["body"])["id"] == event_id
        completed = next(json.loads(a["body"]) for a in got.values()
                         if json.loads(a["body"])["type"] == "run.completed")  # fmt: skip
        assert completed["run"]["result"] == {"x": 1}

        # The receiver has answered 200; the dispatcher records it right after.
        async def all_recorded() -> bool:
            rows = [
                *await api.store.transact(service_webhooks.deliveries, run_a),
                *await api.store.transact(service_webhooks.deliveries, run_b),
            ]
            return {r["status"] for r in rows} == {"delivered"} and len(rows) == 4

        await until(all_recorded, 30)


async def start_payout(api: Any, headers: dict[str, str], url: str | None, ttl: float) -> Any:
    """A payout run that will wait for its guest approval (time to live ``ttl`` seconds)."""
    body: dict[str, Any] = {
        "agent": "payout",
        "input": {"amount": 7, "approval": {"role": "guest", "expires_in": ttl}},
    }
    if url:
        body["webhook"] = url
    return (await api.client.post("/v1/runs", json=body, headers=headers)).json()


async def parked_payout(api: Any, headers: dict[str, str], url: str | None, ttl: float) -> Any:
    """A payout run waiting for its guest approval (time to live ``ttl`` seconds)."""
    run = await start_payout(api, headers, url, ttl)

    async def waiting() -> bool:
        r = (await api.client.get(f"/v1/runs/{run['id']}", headers=headers)).json()
        return bool(r["pending_approval"])

    await until(waiting, 30)
    return (await api.client.get(f"/v1/runs/{run['id']}", headers=headers)).json()


async def test_the_expiring_warning_arrives_at_80_percent_of_the_ttl_signed_and_retried(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    """A short time to live: the warning is sent once, between 80 % of it and the expiry
    (by the service's own clock), over HTTP to a receiver failing twice, the same event
    id and body on every attempt, signed; then the default (reject) ends the run."""
    rec, url = receiver
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'warn.db'}", **FAST)) as api:
        h = await api.key("t1", "gina", ("guest",))
        secret = await api.store.transact(service_webhooks.webhook_secret, "t1")

        def of(kind: str, run_id: str) -> list[dict[str, Any]]:
            return [
                a for a in rec.attempts
                if a["headers"]["AgentLedger-Event"] == kind
                and json.loads(a["body"])["run_id"] == run_id
            ]  # fmt: skip

        ttls: list[float] = []

        async def start(ttl: float) -> str:
            ttls.append(ttl)
            return str((await start_payout(api, h, url, ttl))["id"])

        while True:
            run = await pending_in_time(api, h, start, 2 * ttls[-1] if ttls else FIRST_WARNED_TTL)
            approval = run["pending_approval"]

            async def failed_and_reported(run_id: str = run["id"]) -> bool:
                return any(a["status"] == 200 for a in of("run.failed", run_id))

            await until(failed_and_reported, 60)
            tries = of("approval.expiring", run["id"])
            if tries:
                break
            # No dispatcher pass fell inside the last fifth of the approval's life (a
            # loaded machine): the next run's approval lives twice as long.
            assert ttls[-1] < LAST_WARNED_TTL, f"no warning within a time to live of {ttls}"
        assert [a["status"] for a in tries] == [500, 500, 200]
        assert {a["id"] for a in tries} == {f"evt_{approval['id']}_expiring"}
        assert len({a["body"] for a in tries}) == 1  # the same event, retried
        ok = tries[-1]
        assert verify(secret, ok["headers"]["AgentLedger-Signature"], ok["body"])
        warning = json.loads(ok["body"])
        assert warning["id"] == ok["id"] and warning["run_id"] == run["id"]
        assert warning["data"]["approval_id"] == approval["id"]
        assert warning["data"]["expires_at"] == approval["expires_at"]
        requested, expires = approval["requested_at"], approval["expires_at"]
        assert requested + 0.8 * (expires - requested) <= warning["occurred_at"] < expires
        done = (await api.client.get(f"/v1/runs/{run['id']}", headers=h)).json()
        assert done["status"] == "failed"


async def test_the_expiring_warning_is_enqueued_once_only_for_open_approvals_past_80_percent(
    tmp_path: Path,
) -> None:
    """The rule, on the store's clock argument: not before 80 % of the time to live, once
    from then on, not after the expiry, not once decided, not without a webhook."""
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'rule.db'}", **FAST)) as api:
        h = await api.key("t1", "gina", ("guest",))
        ttl = 1000.0
        run = await parked_payout(api, h, "http://127.0.0.1:9/hook", ttl)
        silent = await parked_payout(api, h, None, ttl)
        a = run["pending_approval"]
        start = a["requested_at"]

        async def enqueue(at: float) -> int:
            n: int = await api.store.transact(service_webhooks.enqueue_expiring, at)
            return n

        async def warnings() -> list[str]:
            rows = await api.store.transact(service_webhooks.deliveries)
            return [r["id"] for r in rows if r["type"] == "approval.expiring"]

        assert await enqueue(start + 0.79 * ttl) == 0
        assert await enqueue(a["expires_at"]) == 0  # expired: too late to warn
        assert await enqueue(start + 0.8 * ttl) == 1
        assert await enqueue(start + 0.9 * ttl) == 1  # looked at again ...
        assert await warnings() == [f"evt_{a['id']}_expiring"]  # ... enqueued once
        assert silent["pending_approval"]["id"] not in str(await warnings())
        body = {"decision": "reject", "arguments_hash": "0" * 64}
        listed = (await api.client.get("/v1/approvals", headers=h)).json()["approvals"]
        body["arguments_hash"] = next(x for x in listed if x["id"] == a["id"])["arguments_hash"]
        r = await api.client.post(f"/v1/approvals/{a['id']}/decision", json=body, headers=h)
        assert r.status_code == 200
        assert await enqueue(start + 0.95 * ttl) == 0  # decided: nothing to warn about


async def test_a_run_handed_to_a_human_is_reported_as_needs_human(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    rec, url = receiver
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'nh.db'}", **FAST)) as api:
        h = await api.key("t1", "olga", ("operator",))
        secret = await api.store.transact(service_webhooks.webhook_secret, "t1")
        body = {"agent": "over_budget", "input": {}, "webhook": url}
        run_id = (await api.client.post("/v1/runs", json=body, headers=h)).json()["id"]

        async def reported() -> bool:
            return any(a["headers"]["AgentLedger-Event"] == "run.needs_human"
                       for a in rec.delivered().values())  # fmt: skip

        await until(reported, 30)
        (ok,) = [a for a in rec.delivered().values()
                 if a["headers"]["AgentLedger-Event"] == "run.needs_human"]  # fmt: skip
        assert verify(secret, ok["headers"]["AgentLedger-Signature"], ok["body"])
        event = json.loads(ok["body"])
        assert event["run_id"] == run_id and event["run"]["status"] == "needs_human"
        assert event["run"]["handover_reason"]
        tries = [a for a in rec.attempts if a["id"] == ok["id"]]
        assert [a["status"] for a in tries] == [500, 500, 200]
