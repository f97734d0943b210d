"""StayHub bookings end to end through the HTTP service (uvicorn on loopback), with
worker subprocesses and the sandbox: the guest approves their own booking and payment
through the API; for a corporate booking the manager approves through the API, or
nobody does and the expiry default (reject) applies."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from agentledger.service import create_app
from agentledger.service._auth import create_key
from agentledger_examples.stayhub.app import app as stayhub_app
from agentledger_examples.stayhub.harness import AGENT
from agentledger_examples.stayhub.sandbox.catalog import GUEST_EMAIL_DOMAIN
from tests.service.conftest import PEPPER, free_port, settings_for, until

from .conftest import INPUT, Stack, StackFactory

pytestmark = pytest.mark.slow

GUEST = "g-123"
CORPORATE = {**INPUT, "company_id": "acme"}


@contextlib.contextmanager
def serve(db: str) -> Iterator[str]:
    """The service for the StayHub app under uvicorn on 127.0.0.1 (no inline workers:
    the stack's worker processes run the runs); yields its base URL."""
    api = create_app(settings_for(db), stayhub_app)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    ready = threading.Event()
    while not server.started and thread.is_alive():
        ready.wait(0.01)
    assert server.started, "the service did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.asynccontextmanager
async def client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    with serve(stack.db) as url:
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=60) as c:
            yield c


async def key(stack: Stack, user: str, *roles: str) -> dict[str, str]:
    full, _ = await create_key(stack.store, PEPPER, "t1", user, list(roles), 3600)
    return {"Authorization": f"Bearer {full}"}


async def start(http: httpx.AsyncClient, guest: dict[str, str], **overrides: Any) -> str:
    body = {"agent": AGENT, "input": {**CORPORATE, **overrides}}
    r = await http.post("/v1/runs", json=body, headers=guest)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


async def pending(
    http: httpx.AsyncClient,
    headers: dict[str, str],
    run_id: str,
    tool: str,
    status: str = "pending",
) -> dict[str, Any]:
    """Wait until the run waits on an approval of ``tool`` that ``headers`` may decide
    (``status="all"``: until it asked for one, whether still pending or not)."""
    found: list[dict[str, Any]] = []

    async def listed() -> bool:
        params = {"status": status}
        answer = await http.get("/v1/approvals", headers=headers, params=params)
        approvals = answer.json()["approvals"]
        found[:] = [a for a in approvals if a["run_id"] == run_id and a["tool"] == tool]
        return bool(found)

    await until(listed, timeout=30)
    return found[0]


async def all_up(stack: Stack) -> None:
    """Wait until every worker of the pool has registered: its start is over, so a
    SIGTERM is a drain (exit 0), never a start cut short."""

    async def registered() -> bool:
        live = {w.pid for w in await stack.store.list_workers(live_within=60)}
        return {p.pid for p in stack.pool.procs} <= live

    await until(registered, timeout=60)


async def decide(
    http: httpx.AsyncClient, headers: dict[str, str], approval: dict[str, Any], decision: str
) -> httpx.Response:
    body = {"decision": decision, "arguments_hash": approval["arguments_hash"]}
    return await http.post(f"/v1/approvals/{approval['id']}/decision", json=body, headers=headers)


def kinds(stack: Stack, run_id: str) -> list[str]:
    return sorted(str(e["kind"]) for e in stack.sandbox.ledger() if e.get("run_id") == run_id)


async def test_manager_approves_through_the_api_across_a_worker_restart(
    stayhub: StackFactory,
) -> None:
    # One worker: the deploy below stops every worker there is and starts them anew,
    # which one proves as well as two (each start is a process start paid in full).
    async with stayhub(guest_approver=False, workers=1) as stack, client(stack) as http:
        guest = await key(stack, GUEST, "guest")
        manager = await key(stack, "mona", "manager")
        run_id = await start(http, guest)
        booking = await pending(http, manager, run_id, "create_booking")
        assert booking["required_role"] == "manager"
        assert booking["arguments"]["guest_id"] == GUEST
        # The guest may not decide the manager's approval: it is not even listed to them.
        mine = (await http.get("/v1/approvals", headers=guest)).json()["approvals"]
        assert [a for a in mine if a["run_id"] == run_id] == []
        assert (await decide(http, guest, booking, "approve")).status_code == 403

        # A deploy while the run waits: every worker stops (SIGTERM), new ones start.
        # Every one is up first (a SIGTERM during a start ends it before its handlers
        # exist, which is not a drain).
        await all_up(stack)
        old = list(stack.pool.procs)
        stack.pool.stop(timeout=15)
        assert [p.returncode for p in old] == [0] * len(old), stack.logs()
        stack.pool.start()
        run = (await http.get(f"/v1/runs/{run_id}", headers=guest)).json()
        assert run["status"] == "waiting" and run["pending_approval"]["id"] == booking["id"]

        ok = await decide(http, manager, booking, "approve")
        assert ok.status_code == 200, ok.text
        assert ok.json()["decided_by"] == "mona"
        payment = await pending(http, guest, run_id, "create_payment")
        assert payment["required_role"] == "guest"
        assert payment["arguments"]["amount"]["amount"] > 0  # computed by the server
        assert (await decide(http, guest, payment, "approve")).status_code == 200

        result = await http.get(f"/v1/runs/{run_id}/result?wait=40", headers=guest)
        assert result.status_code == 200, result.text
        assert result.json()["status"] == "completed", stack.logs()
        assert "Booked" in result.json()["result"]["answer"]
        await stack.drain()
        assert [k for k in kinds(stack, run_id) if k in ("booking", "charge")] == [
            "booking",
            "charge",
        ]
        approvals = await stack.store.get_approvals(run_id)
        assert [(a.tool, a.required_role, a.decided_by) for a in approvals] == [
            ("create_booking", "manager", "mona"),
            ("create_payment", "guest", GUEST),
        ]
        invariants = stack.invariants()
        assert invariants["ok"] and invariants["emails"] == 1, invariants


async def test_an_expired_manager_approval_is_rejected_and_the_guest_told_once(
    stayhub: StackFactory,
) -> None:
    # Short: nothing in the test has to happen before the expiry. The approval is listed
    # with status=all (pending or expired alike), and the results wait for the expiry.
    env = {"STAYHUB_MANAGER_APPROVAL_SECONDS": "1.5"}
    async with stayhub(env=env, guest_approver=False, workers=1) as stack, client(stack) as http:
        guest = await key(stack, GUEST, "guest")
        manager = await key(stack, "mona", "manager")
        # Two requests: each rejection email is its own (not deduplicated across runs).
        run_ids = [await start(http, guest), await start(http, guest, check_in="2026-12-27")]
        booking = await pending(http, manager, run_ids[0], "create_booking", status="all")
        assert booking["required_role"] == "manager"
        assert booking["expires_at"] - booking["requested_at"] == pytest.approx(1.5)

        # Nobody decides: the workers apply the default when it expires.
        for run_id in run_ids:
            result = await http.get(f"/v1/runs/{run_id}/result?wait=40", headers=guest)
            assert result.status_code == 200, result.text
            assert result.json()["status"] == "completed", stack.logs()
            assert "did not approve" in result.json()["result"]["answer"]
        late = await decide(http, manager, booking, "approve")
        assert late.status_code == 410, late.text
        counts = await stack.drain()
        assert not counts.get("pending") and not counts.get("dead"), counts
        for run_id in run_ids:
            (approval,) = await stack.store.get_approvals(run_id)
            assert (approval.decision, approval.decided_by) == ("reject", "system:expired")
            step = next(s for s in await stack.journal(run_id) if s.name == "create_booking")
            assert step.status == "failed" and step.error_class == "refused"
            assert kinds(stack, run_id) == ["email"]  # no booking, no charge, one email
            (email,) = [
                e for e in stack.sandbox.ledger() if e["kind"] == "email" and e["run_id"] == run_id
            ]
            assert email["recipient"] == f"{GUEST}@{GUEST_EMAIL_DOMAIN}"
            assert "not approved" in email["subject"]
        assert stack.invariants()["ok"]


async def test_the_guest_approves_their_own_booking_and_payment_through_the_api(
    stayhub: StackFactory,
) -> None:
    async with stayhub(guest_approver=False) as stack, client(stack) as http:
        guest = await key(stack, GUEST, "guest")
        other_guest = await key(stack, "g-999", "guest")
        r = await http.post("/v1/runs", json={"agent": AGENT, "input": INPUT}, headers=guest)
        assert r.status_code == 202, r.text
        run_id = str(r.json()["id"])
        booking = await pending(http, guest, run_id, "create_booking")
        assert booking["required_role"] == "guest"
        assert booking["arguments"]["guest_id"] == GUEST
        # Another guest neither sees nor decides it.
        theirs = (await http.get("/v1/approvals", headers=other_guest)).json()["approvals"]
        assert [a for a in theirs if a["run_id"] == run_id] == []
        assert (await decide(http, other_guest, booking, "approve")).status_code == 403
        assert (await decide(http, guest, booking, "approve")).status_code == 200
        payment = await pending(http, guest, run_id, "create_payment")
        assert payment["arguments"]["amount"]["amount"] > 0  # computed by the server
        ok = await decide(http, guest, payment, "approve")
        assert ok.status_code == 200 and ok.json()["decided_by"] == GUEST
        result = await http.get(f"/v1/runs/{run_id}/result?wait=40", headers=guest)
        assert result.status_code == 200 and result.json()["status"] == "completed", stack.logs()
        await stack.drain()
        assert [k for k in kinds(stack, run_id) if k in ("booking", "charge")] == [
            "booking",
            "charge",
        ]
        assert stack.invariants()["ok"]
