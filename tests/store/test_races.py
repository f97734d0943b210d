"""Races between processes' store calls, each side a thread with its own event loop, store
and connections, released together by a barrier, for many rounds on every backend:
two claimers, claim vs cancel, finish vs cancel, decide vs expire, heartbeat vs finish,
reap vs claim vs release."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentledger.errors import LeaseLost
from agentledger.records import Approval, Run
from agentledger.store import AlreadyDecided, Batch, NewRun, RunUpdate, Store, open_store

TARGET = "agent@1"
ROUNDS = 25

Action = Callable[[Store, Any], Awaitable[Any]]


class Racers:
    """Threads that each own a store and run one action per round, all at once."""

    def __init__(self, url: str, actions: list[Action]) -> None:
        self.actions = actions
        self.start = threading.Barrier(len(actions) + 1)
        self.done = threading.Barrier(len(actions) + 1)
        self.state: Any = None
        self.outcomes: list[Any] = [None] * len(actions)
        self.stop = False
        self.threads = [
            threading.Thread(target=self._serve, args=(url, i), daemon=True)
            for i in range(len(actions))
        ]
        for t in self.threads:
            t.start()

    def _serve(self, url: str, index: int) -> None:
        async def main() -> None:
            store = open_store(url)
            await store.open()
            try:
                while True:
                    self.start.wait()
                    if self.stop:
                        return
                    try:
                        self.outcomes[index] = await self.actions[index](store, self.state)
                    except Exception as exc:
                        self.outcomes[index] = exc
                    self.done.wait()
            finally:
                await store.close()

        asyncio.run(main())

    async def round(self, state: Any) -> list[Any]:
        self.state = state
        await asyncio.to_thread(self.start.wait, 30)
        await asyncio.to_thread(self.done.wait, 30)
        return list(self.outcomes)

    async def close(self) -> None:
        self.stop = True
        await asyncio.to_thread(self.start.wait, 30)
        for t in self.threads:
            await asyncio.to_thread(t.join, 30)


def new_run() -> NewRun:
    return NewRun(kind="agent", name="agent", version="1", input={})


async def race(url: str, actions: list[Action]) -> Racers:
    return Racers(url, actions)


async def test_two_claimers_never_claim_one_run_twice(store: Store, store_url: str) -> None:
    async def claim(s: Store, _: Any) -> list[Run]:
        return await s.claim_runs(f"w{threading.get_ident()}", [TARGET], 3, 30)

    racers = Racers(store_url, [claim, claim, claim])
    try:
        for _ in range(ROUNDS):
            made = {(await store.create_run(new_run())).id for _ in range(4)}
            outcomes = await racers.round(None)
            got = [r.id for o in outcomes for r in o]
            assert len(got) == len(set(got)) == 4 and set(got) == made, outcomes
            for o in outcomes:
                for run in o:
                    assert run.lease_epoch == 1
            await store._call(  # clear the table for the next round
                lambda tx: tx.execute("UPDATE runs SET status = 'completed'")
            )
    finally:
        await racers.close()


async def test_claim_vs_cancel_of_a_queued_run(store: Store, store_url: str) -> None:
    async def claim(s: Store, _: Any) -> list[Run]:
        return await s.claim_runs("wA", [TARGET], 5, 30)

    async def cancel(s: Store, run_id: str) -> Run:
        return await s.cancel_run(run_id, "stop", "alice")

    racers = Racers(store_url, [claim, cancel])
    try:
        for _ in range(ROUNDS):
            run = await store.create_run(new_run())
            claimed, _cancelled = await racers.round(run.id)
            assert not isinstance(claimed, Exception) and not isinstance(_cancelled, Exception)
            final = await store.get_run(run.id)
            assert final is not None
            if claimed:
                assert final.status == "running" and final.lease_owner == "wA"
                assert final.cancel_requested == "stop"  # honoured at the next boundary
            else:
                assert final.status == "cancelled" and final.lease_owner is None
    finally:
        await racers.close()


async def test_finish_vs_cancel_never_turns_completed_into_cancelled(
    store: Store, store_url: str
) -> None:
    async def finish(s: Store, run: Run) -> None:
        assert run.lease_owner is not None
        await s.commit(
            Batch(
                run.id,
                run.lease_epoch,
                run.lease_owner,
                run=RunUpdate(step_count=1, status="completed", result={"ok": 1}),
            )
        )

    async def cancel(s: Store, run: Run) -> Run:
        return await s.cancel_run(run.id, "stop", "alice")

    racers = Racers(store_url, [finish, cancel])
    try:
        for _ in range(ROUNDS):
            await store.create_run(new_run())
            (run,) = await store.claim_runs("wA", [TARGET], 1, 30)
            finished, _ = await racers.round(run)
            assert finished is None  # a cancel never fences the worker out
            final = await store.get_run(run.id)
            assert final is not None and final.status == "completed"
            assert final.result == {"ok": 1}
    finally:
        await racers.close()


async def test_a_decision_racing_expiry_has_exactly_one_winner(
    store: Store, store_url: str
) -> None:
    async def human(s: Store, approval_id: str) -> Approval:
        return await s.decide_approval(approval_id, "approve", "alice")

    async def expiry(s: Store, approval_id: str) -> Approval:
        return await s.decide_approval(approval_id, "reject", "expiry")

    racers = Racers(store_url, [human, expiry])
    try:
        for i in range(ROUNDS):
            await store.create_run(new_run())
            (run,) = await store.claim_runs("wA", [TARGET], 1, 30)
            now = time.time()
            approval = Approval(
                id=f"ap{i}",
                run_id=run.id,
                step_no=1,
                tool="refund",
                arguments={},
                required_role="manager",
                requested_at=now,
                expires_at=now + 3600,  # a person's decision after expiry is never recorded
                default_decision="reject",
            )
            await store.commit(
                Batch(
                    run.id,
                    run.lease_epoch,
                    "wA",
                    approvals=[approval],
                    run=RunUpdate(status="waiting", available_at=None),
                )
            )
            outcomes = await racers.round(approval.id)
            winners = [o for o in outcomes if isinstance(o, Approval)]
            losers = [o for o in outcomes if isinstance(o, AlreadyDecided)]
            assert len(winners) == 1 and len(losers) == 1, outcomes
            (row,) = await store.get_approvals(run.id)
            assert (row.decision, row.decided_by) == (
                winners[0].decision,
                winners[0].decided_by,
            )
            assert losers[0].approval.decided_by == row.decided_by
            decided = [e for e in await store.list_events(run.id) if e.type == "approval.decided"]
            assert len(decided) == 1
            await store._call(  # never claimed again in the next rounds
                lambda tx: tx.execute("UPDATE runs SET status = 'completed'")
            )
    finally:
        await racers.close()


async def test_heartbeat_vs_finish_never_revives_a_finished_run(
    store: Store, store_url: str
) -> None:
    async def renew(s: Store, run: Run) -> set[str]:
        lost: set[str] = set()
        for _ in range(5):
            lost |= await s.renew_leases("wA", {run.id: run.lease_epoch}, 30)
        return lost

    async def finish(s: Store, run: Run) -> None:
        await s.commit(Batch(run.id, run.lease_epoch, "wA", run=RunUpdate(status="completed")))

    racers = Racers(store_url, [renew, finish])
    try:
        for _ in range(ROUNDS):
            await store.create_run(new_run())
            (run,) = await store.claim_runs("wA", [TARGET], 1, 30)
            _lost, finished = await racers.round(run)
            assert finished is None
            final = await store.get_run(run.id)
            assert final is not None and final.status == "completed"
            assert final.lease_owner is None and final.lease_expires_at is None
            assert await store.renew_leases("wA", {run.id: run.lease_epoch}, 30) == {run.id}
    finally:
        await racers.close()


async def test_reap_vs_claim_vs_release(store: Store, store_url: str) -> None:
    async def reap(s: Store, run: Run) -> int:
        return await s.expire_leases_of(["dead"])

    async def claim(s: Store, run: Run) -> list[Run]:
        taken: list[Run] = []
        for _ in range(20):  # until the reaper's expiry is visible, or give up
            taken = await s.claim_runs("wB", [TARGET], 1, 30)
            if taken:
                break
        return taken

    async def release(s: Store, run: Run) -> bool:
        return await s.release_run(run.id, run.lease_epoch, "dead")

    racers = Racers(store_url, [reap, claim, release])
    try:
        for _ in range(ROUNDS):
            await store.create_run(new_run())
            (run,) = await store.claim_runs("dead", [TARGET], 1, 30)
            _reaped, taken, released = await racers.round(run)
            assert not any(isinstance(o, Exception) for o in (_reaped, taken, released))
            final = await store.get_run(run.id)
            assert final is not None
            if taken:
                (mine,) = taken
                assert mine.lease_epoch == run.lease_epoch + 1
                assert final.lease_owner == "wB" and final.status == "running"
                assert final.lease_epoch == mine.lease_epoch
            else:
                assert released and final.status == "queued"  # given back, nobody took it
            with pytest.raises(LeaseLost):  # the dead owner's late write is fenced
                await store.commit(Batch(run.id, run.lease_epoch, "dead", run=RunUpdate()))
            await store._call(  # clear the table for the next round
                lambda tx: tx.execute("UPDATE runs SET status = 'completed'")
            )
    finally:
        await racers.close()
