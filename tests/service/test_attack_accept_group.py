"""A group of accepts with bad members, on each backend: one refused before any write,
one failing mid-write (its group falls back to one by one), keys repeated and reused,
and the tenant's quota at its edge. The good members are accepted exactly once, each bad
one gets its own answer, and a refused member never spends the quota."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from agentledger._canonical import clean_text
from agentledger.errors import StoreError
from agentledger.service import _accepting as accepting
from agentledger.service._accepting import (
    IdempotencyMismatch,
    IdempotencyRequest,
    Quota,
    QuotaExceeded,
    SubmitRequest,
)
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store, open_store
from agentledger.store._tx import Tx
from tests.service.test_accept_group_fast import ok, request, respond, submit, table, took_fast_path
from tests.store.pgproxy import COMMIT, LossyProxy


class Boom(RuntimeError):
    """The error of a member failing mid-write."""


def failing(run: Any) -> Any:
    raise Boom("response cannot be built")


async def counts(store: Store) -> tuple[int, int, int]:
    runs = await table(store, "SELECT COUNT(*) AS n FROM runs")
    events = await table(store, "SELECT COUNT(*) AS n FROM events")
    keys = await table(store, "SELECT COUNT(*) AS n FROM idempotency_keys")
    return int(runs[0]["n"]), int(events[0]["n"]), int(keys[0]["n"])


@pytest.mark.parametrize("fallback", [False, True], ids=["set", "one-by-one"])
async def test_bad_members_fail_alone_and_never_spend_the_quota(
    store: Store, fallback: bool
) -> None:
    quota = Quota(max_in_flight=4)
    first, _ = await submit(store, [request(0, key="b", quota=quota, tag="pre")])
    assert not ok(first[0]).replayed  # 3 slots remain
    group = [
        request(1, key="a", quota=quota),
        request(2, key="c", quota=quota),  # refused before any write: a bad time
        request(3, key="a", quota=quota),  # a replay of the first, in the group
        request(4, key="b", body="other", quota=quota),  # reused with another body
        request(5, key="b", body="same", quota=quota),  # a replay of the earlier group
        request(6, quota=quota),
        request(7, quota=quota),
        request(8, quota=quota),  # one over the quota
    ]
    group[1].new.available_at = math.nan
    if fallback:
        group[5].respond = failing  # fails mid-write, alone in the fallback
    outcomes, statements = await submit(store, group)
    assert took_fast_path(statements) is not fallback
    assert not ok(outcomes[0]).replayed
    assert isinstance(outcomes[1], (StoreError, ValueError)), outcomes[1]
    assert ok(outcomes[2]).replayed and ok(outcomes[2]).run.id == ok(outcomes[0]).run.id
    assert isinstance(outcomes[3], IdempotencyMismatch)
    assert ok(outcomes[4]).replayed and ok(outcomes[4]).run.id == ok(first[0]).run.id
    if fallback:
        assert isinstance(outcomes[5], Boom)
        assert not ok(outcomes[6]).replayed and not ok(outcomes[7]).replayed
    else:
        assert not ok(outcomes[5]).replayed and not ok(outcomes[6]).replayed
        assert isinstance(outcomes[7], QuotaExceeded)
    new = 3  # the quota's last three slots
    runs, events, keys = await counts(store)
    assert (runs, events, keys) == (1 + new, 2 * (1 + new), 2)
    ids = [o.run.id for o in outcomes if not isinstance(o, BaseException)]
    assert len(set(ids)) == 1 + new  # a, b and the new ones: no run twice
    # The quota is spent now: one more is refused; a replay still answers.
    more, _ = await submit(store, [request(9, quota=quota, tag="x"),
                                   request(10, key="a", quota=quota, tag="x")])  # fmt: skip
    assert isinstance(more[0], QuotaExceeded)
    assert ok(more[1]).replayed
    await store.transact(service_audit.seal)
    checked, broken = await store.read(lambda tx: service_audit.verify_chain(tx))
    assert broken == [] and checked == events


async def test_a_key_whose_first_member_fails_mid_write_is_accepted_by_the_second(
    store: Store,
) -> None:
    """The first submit of a key fails mid-write; the second, in the same group, was a
    replay of it: in the fallback it is accepted as the key's first, once."""
    group = [request(0, key="k"), request(1, key="k"), request(2, key="k")]
    group[0].respond = failing
    outcomes, _ = await submit(store, group)
    assert isinstance(outcomes[0], Boom)
    assert not ok(outcomes[1]).replayed
    assert ok(outcomes[2]).replayed and ok(outcomes[2]).run.id == ok(outcomes[1]).run.id
    assert ok(outcomes[2]).response == ok(outcomes[1]).response
    assert await counts(store) == (1, 2, 1)
    keys = await table(store, "SELECT run_id, response FROM idempotency_keys")
    assert keys[0]["run_id"] == ok(outcomes[1]).run.id


async def test_replays_answer_the_first_response_byte_for_byte(store: Store) -> None:
    """What the key's first submit answered, a replay in the same group and one in a
    later group answer alike, hostile numbers and text included."""

    def hostile(run: Any) -> Any:
        return {**respond(run), "z": -0.0, "big": 1e308, "tiny": 5e-324, "t": "\u00e9\U0001f600"}

    group = [request(0, key="h"), request(1, key="h")]
    for r in group:
        r.respond = hostile
    outcomes, _ = await submit(store, group)
    later, _ = await submit(store, [request(2, key="h", tag="l")])
    bodies = [ok(outcomes[0]).response, ok(outcomes[1]).response, ok(later[0]).response]
    assert len({json.dumps(b) for b in bodies}) == 1, bodies
    assert math.copysign(1.0, bodies[2]["z"]) == -1.0


@pytest.mark.parametrize("tenant", ["n\x00ul", "s\ud800x"])
async def test_a_key_in_a_tenant_the_store_cleans_is_replayed(store: Store, tenant: str) -> None:
    """A tenant id with a NUL or a lone surrogate is stored cleaned (U+FFFD): its key is
    found again in a later group, under either spelling, and replayed, not written
    twice; one quota counts the runs of both spellings."""
    stored = clean_text(tenant)
    quota = Quota(max_in_flight=2)
    first, _ = await submit(store, [request(0, key="k", tenant=tenant, quota=quota)])
    later, _ = await submit(store, [
        request(1, key="k", tenant=tenant, quota=quota, tag="l"),
        request(2, key="k", tenant=stored, quota=quota, tag="l"),
        request(3, key="k", body="other", tenant=tenant, quota=quota, tag="l"),
        request(4, tenant=stored, quota=quota, tag="l"),
        request(5, tenant=tenant, quota=quota, tag="l"),
    ])  # fmt: skip
    for replay in later[:2]:
        assert ok(replay).replayed and ok(replay).run.id == ok(first[0]).run.id
    assert isinstance(later[2], IdempotencyMismatch)
    assert not ok(later[3]).replayed
    assert isinstance(later[4], QuotaExceeded)
    assert await counts(store) == (2, 4, 1)


async def test_a_request_id_the_store_cleans_answers_its_run_when_retried(
    store: Store,
) -> None:
    """A submit retried (its commit reply lost) with a request id the store keeps
    cleaned answers the run it made, not a unique violation."""
    first = request(0)
    first.new.request_id = "q\x00\ud800"
    done, _ = await submit(store, [first])
    again, _ = await submit(store, [first, request(1)])
    assert ok(again[0]).run.id == ok(done[0]).run.id and not ok(again[1]).replayed
    assert await counts(store) == (2, 4, 0)


@pytest.mark.postgres
async def test_an_expired_key_replaced_by_another_process_meanwhile_is_replayed(
    pg_url: str,
) -> None:
    """Both see the key's expired row; the other process replaces it and commits
    between this group's read and its writes: this group's DELETE finds nothing, its
    INSERT meets the new row, and the submit replays the other process's run."""
    store = open_store(pg_url)
    await store.open()
    try:
        gone = request(0, key="k", tag="gone")
        gone.idem = IdempotencyRequest("k", "fp-same", 0.0)  # expired at once
        await submit(store, [gone])
        theirs: list[Any] = []

        def racing(run: Any) -> Any:
            if not theirs:
                c2 = store.dialect.connect()
                try:
                    other = SubmitRequest(
                        request(9, tag="other").new, {"user_id": "bob"}, None,
                        IdempotencyRequest("k", "fp-same", 3600.0), Quota(), respond,
                    )  # fmt: skip
                    theirs.append(accepting.accept(Tx(store.dialect, c2), [other])[0])
                    c2.commit()
                finally:
                    c2.close()
            return respond(run)

        group = [request(1, key="k"), request(2, key="k"), request(3)]
        group[0].respond = racing
        outcomes, statements = await submit(store, group)
        assert "ROLLBACK TO SAVEPOINT accept_group" in statements
        won = ok(theirs[0])
        for replay in outcomes[:2]:
            assert ok(replay).replayed and ok(replay).run.id == won.run.id
        assert not ok(outcomes[2]).replayed
        keys = await table(store, "SELECT run_id FROM idempotency_keys")
        assert keys == [{"run_id": won.run.id}]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_a_fallen_back_group_whose_commit_reply_is_lost_answers_each_once(
    proxy: LossyProxy,
) -> None:
    """A group that fell back to one by one (a member failing mid-write), with a key
    twice and a quota at its edge, loses its COMMIT reply: the store runs it again, and
    each member gets the answer it had -- one run each, the failing one still refused,
    no slot of the quota spent twice."""
    store = open_store(proxy.url)
    await store.open()
    try:
        quota = Quota(max_in_flight=3)
        group = [
            request(0, key="a", quota=quota, tag="lc"),
            request(1, quota=quota, tag="lc"),  # fails mid-write
            request(2, key="a", quota=quota, tag="lc"),  # replay of the first
            request(3, quota=quota, tag="lc"),
            request(4, quota=quota, tag="lc"),
            request(5, quota=quota, tag="lc"),  # over the quota
        ]
        group[1].respond = failing
        proxy.arm(COMMIT)
        outcomes = await store.transact(accepting.accept, group)
        assert proxy.cut.is_set()
        # Run again, the failing member meets the quota first: the group's own runs,
        # committed, fill it. Refused either way, and never written.
        assert isinstance(outcomes[1], (Boom, QuotaExceeded))
        assert isinstance(outcomes[5], QuotaExceeded)
        made = [ok(outcomes[i]).run.id for i in (0, 3, 4)]
        assert ok(outcomes[2]).replayed and ok(outcomes[2]).run.id == made[0]
        runs = await table(store, "SELECT id FROM runs ORDER BY id")
        assert sorted(made) == [r["id"] for r in runs]
        assert await counts(store) == (3, 6, 1)
    finally:
        await store.close()
