"""Decisions and votes sent again across an approval's expiry, through the API.

A decision (or an approver's vote) that committed before expiry is recorded: the same
decider sending it again after expiry -- its reply was lost -- is answered with what was
recorded (200), never 410 ("nothing recorded"), and the audit trail keeps one decision
context for it. Only the store, holding the approval's row, can tell a late decision
from a retry whose first attempt is still committing, so expiry is judged there alone.
A key whose user is in the ``system:`` namespace (the expiry default's and cancel's)
decides nothing: that namespace is exempt from the expiry rule and the policy's
conditions.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg

from agentledger._clock import FakeClock
from agentledger.records import Approval, Run
from agentledger.service._queries import approvals as service_approvals
from agentledger.service._routers.approvals import arguments_hash
from agentledger.store import RunUpdate, Store, open_store
from agentledger.store._tx import Tx
from tests.service.conftest import Api, in_process, settings_for
from tests.service.test_runs_api import assert_problem
from tests.store.test_contract import batch, new_run

EXPIRES = 1_900_000_000.0  # on the engine's clock, as the gate writes it
ARGS = {"amount": 5}


async def waiting(store: Store, approval_id: str, needed: int = 1) -> Run:
    """A run of tenant t1 (started by gina) waiting for ``approval_id``, a manager's,
    which expires at EXPIRES."""
    assert isinstance(store, Store)
    await store.create_run(new_run(version=approval_id, tenant_id="t1", user_id="gina"))
    (run,) = await store.claim_runs("w1", [f"agent@{approval_id}"], 1, 30)
    approval = Approval(
        id=approval_id,
        run_id=run.id,
        step_no=1,
        tool="refund",
        arguments=ARGS,
        required_role="manager",
        requested_at=EXPIRES - 600,
        expires_at=EXPIRES,
        default_decision="reject",
        requested_by="gina",
        approvals_needed=needed,
    )
    await store.commit(
        batch(run, approvals=[approval], run=RunUpdate(status="waiting", available_at=None))
    )
    return run


def body(decision: str = "approve") -> dict[str, Any]:
    return {"decision": decision, "arguments_hash": arguments_hash(ARGS)}


async def types_of(store: Store, run_id: str) -> list[str]:
    return [e.type for e in await store.list_events(run_id)]


async def test_a_vote_sent_again_answers_the_recorded_vote_before_and_after_expiry(
    api: Api,
) -> None:
    mona = await api.key("t1", "mona", ("manager",))
    max_ = await api.key("t1", "max", ("manager",))
    run = await waiting(api.store, "ap1", needed=2)
    clock = FakeClock(EXPIRES - 2)
    api.app.state.clock = clock
    url = "/v1/approvals/ap1/decision"

    first = await api.client.post(url, json=body(), headers=mona)
    assert first.status_code == 200, first.text
    assert first.json()["decision"] is None and first.json()["approvers"] == ["mona"]
    clock.advance(1)  # still before expiry: the vote sent again (its reply was lost)
    again = await api.client.post(url, json=body(), headers=mona)
    assert again.status_code == 200, again.text
    assert again.json()["approvers"] == ["mona"]
    clock.advance(2)  # past expiry: the vote was recorded before it, so it is answered
    late = await api.client.post(url, json=body(), headers=mona)
    assert late.status_code == 200, late.text
    assert late.json()["approvers"] == ["mona"] and late.json()["decision"] is None
    assert late.json()["expired"] is True

    # A vote first sent after expiry is refused and records nothing.
    assert_problem(await api.client.post(url, json=body(), headers=max_), 410, "expired")
    (approval,) = await api.store.get_approvals(run.id)
    assert (approval.decision, approval.approvers) == (None, ["mona"])
    types = await types_of(api.store, run.id)
    assert types.count("approval.approved_by") == 1, types
    # One vote, one context record (key, roles, request): not one per attempt.
    assert types.count("approval.decision_context") == 1, types


async def _waits_on_a_lock(url: str) -> bool:
    """True when some session of this database waits for a row lock."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        row = await cur.fetchone()
        return bool(row and row[0])


def slow_first_attempt(approval_id: str, holding: threading.Event, release: threading.Event) -> Any:
    """mona's first attempt at approving: judged before expiry, then its COMMIT is slow
    (the row, or SQLite's write lock, stays held until ``release``)."""
    context = {"approval_id": approval_id, "key_id": "first-attempt"}

    def first_attempt(tx: Tx) -> Any:
        decided = service_approvals.decide_with_context(
            tx, approval_id, "approve", "mona", context, FakeClock(EXPIRES - 1)
        )
        holding.set()
        release.wait(60)
        return decided

    return first_attempt


async def assert_the_retry_got_the_first_decision(
    store: Store, run_id: str, answered: Any, first: Any
) -> None:
    decided, made = first
    assert made and (decided.decision, decided.decided_by) == ("approve", "mona")
    assert answered.status_code == 200, answered.text
    assert (answered.json()["decision"], answered.json()["decided_by"]) == ("approve", "mona")
    types = await types_of(store, run_id)
    assert types.count("approval.decided") == 1, types
    assert types.count("approval.decision_context") == 1, types


async def test_a_retry_read_while_the_first_decision_commits_across_expiry_gets_it(
    pg_url: str,
) -> None:
    """The first attempt holds the row and is judged before expiry; its COMMIT is slow
    (its reply is lost to the client). The client's retry is read after expiry, while
    the approval still looks undecided: it must wait for the row and answer the
    decision that committed, not 410 -- the decision was recorded and the run goes on."""
    async with in_process(settings_for(pg_url)) as api:
        mona = await api.key("t1", "mona", ("manager",))
        run = await waiting(api.store, "ap2")
        other = open_store(pg_url)
        await other.open()
        holding, release = threading.Event(), threading.Event()
        first_attempt = slow_first_attempt("ap2", holding, release)
        try:
            first = asyncio.ensure_future(other.transact(first_attempt))
            assert await asyncio.to_thread(holding.wait, 60)
            api.app.state.clock = FakeClock(EXPIRES + 1)
            retry = asyncio.ensure_future(
                api.client.post("/v1/approvals/ap2/decision", json=body(), headers=mona)
            )
            while not retry.done() and not await _waits_on_a_lock(pg_url):
                await asyncio.sleep(0.01)
            release.set()
            answered = await retry
            committed = await first
        finally:
            release.set()
            await other.close()
        await assert_the_retry_got_the_first_decision(api.store, run.id, answered, committed)


async def test_a_retry_read_while_the_first_decision_commits_across_expiry_gets_it_sqlite(
    tmp_path: Any,
) -> None:
    """The same on SQLite: the first attempt holds the write transaction (judged before
    expiry, not committed); the retry's read, on a read connection, finds the approval
    undecided after expiry, and its write waits behind the first attempt's."""
    async with in_process(settings_for(f"sqlite:///{tmp_path / 'a.db'}")) as api:
        store = api.store
        assert isinstance(store, Store)
        mona = await api.key("t1", "mona", ("manager",))
        run = await waiting(store, "ap4")
        holding, release = threading.Event(), threading.Event()
        first_attempt = slow_first_attempt("ap4", holding, release)
        try:
            first = asyncio.ensure_future(store.transact(first_attempt))
            assert await asyncio.to_thread(holding.wait, 60)
            api.app.state.clock = FakeClock(EXPIRES + 1)
            retry = asyncio.ensure_future(
                api.client.post("/v1/approvals/ap4/decision", json=body(), headers=mona)
            )
            # The retry's write is queued behind the held transaction (or it answered).
            while not retry.done() and store._queue.qsize() == 0:
                await asyncio.sleep(0.01)
            release.set()
            answered = await retry
            committed = await first
        finally:
            release.set()
        await assert_the_retry_got_the_first_decision(store, run.id, answered, committed)


async def test_a_key_of_a_system_user_decides_nothing(api: Api) -> None:
    """``system:...`` deciders are exempt from the expiry rule and the policy's
    conditions (they are the expiry default and cancel): a key acting as such a user
    would approve alone what needs two approvers, or decide after expiry."""
    run = await waiting(api.store, "ap3", needed=2)
    clock = FakeClock(EXPIRES - 60)
    api.app.state.clock = clock
    for user in ("system:ops", "system:expired"):
        forged = await api.key("t1", user, ("manager", "approver"))
        for _ in range(2):  # before expiry, then after it
            assert_problem(
                await api.client.post("/v1/approvals/ap3/decision", json=body(), headers=forged),
                403, "forbidden",
            )  # fmt: skip
            clock.advance(120)
        clock.advance(-240)
    (approval,) = await api.store.get_approvals(run.id)
    assert (approval.decision, approval.decided_by, approval.approvers) == (None, None, [])
    assert "approval.decided" not in await types_of(api.store, run.id)
