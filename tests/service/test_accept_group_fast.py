"""A group of accepts in a few statements (service/_accepting.py), on each backend: the
answers and the rows it writes, duplicates of a key inside the group, a key from an
earlier group, a quota refusal mid-group, and a failing statement that makes each submit
of the group accepted again alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentledger import _sealer as sealer
from agentledger.service import _accepting as accepting
from agentledger.service._accepting import (
    IdempotencyMismatch,
    IdempotencyRequest,
    Quota,
    QuotaExceeded,
    SubmitRequest,
    Submitted,
)
from agentledger.service._queries import audit as service_audit
from agentledger.store import NewRun, Store, open_store
from agentledger.store._dialect import Dialect
from agentledger.store._tx import Tx
from tests import dbutil
from tests.store.pgproxy import READY_FOR_QUERY, LossyProxy


class Counting:
    """A dialect that counts the statements it runs (everything else passes through)."""

    def __init__(self, inner: Dialect) -> None:
        self.inner = inner
        self.statements: list[str] = []

    def execute(self, conn: Any, sql: str, params: dict[str, Any] | None = None) -> int:
        self.statements.append(sql)
        return self.inner.execute(conn, sql, params)

    def fetchall(
        self, conn: Any, sql: str, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        self.statements.append(sql)
        return self.inner.fetchall(conn, sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def respond(run: Any) -> dict[str, Any]:
    return {"id": run.id, "status": run.status, "created_at": run.created_at}


def request(
    i: int,
    key: str | None = None,
    body: str = "same",
    tenant: str = "t1",
    webhook: str | None = None,
    quota: Quota | None = None,
    tag: str = "",
) -> SubmitRequest:
    new = NewRun(
        kind="workflow", name="free", version="1", input={"i": i, "body": body},
        tenant_id=tenant, user_id=f"user{i % 2}", request_id=f"q{tag}_{i}",
    )  # fmt: skip
    idem = IdempotencyRequest(key, f"fp-{body}", 3600.0) if key is not None else None
    principal = {"user_id": f"user{i % 2}", "key_id": f"k{i}", "roles": ["operator"]}
    return SubmitRequest(new, principal, webhook, idem, quota or Quota(), respond, f"req{i}")


async def submit(
    store: Store, requests: list[SubmitRequest]
) -> tuple[list[Submitted | BaseException], list[str]]:
    """The group's outcomes and the statements it ran."""
    box: list[Counting] = []

    def job(tx: Tx) -> list[Submitted | BaseException]:
        counting = Counting(tx.dialect)
        box.append(counting)
        return accepting.accept(Tx(counting, tx.conn), requests)  # type: ignore[arg-type]

    outcomes = await store.transact(job)
    return outcomes, box[-1].statements


def took_fast_path(statements: list[str]) -> bool:
    """Whether the group was accepted whole, set-based (not again one by one)."""
    return "SAVEPOINT accept_group" in statements and not any(
        s.startswith("ROLLBACK TO SAVEPOINT") or s.startswith("SAVEPOINT accept0")
        for s in statements
    )


def ok(outcome: Submitted | BaseException) -> Submitted:
    assert isinstance(outcome, Submitted), outcome
    return outcome


async def table(store: Store, sql: str) -> list[dict[str, Any]]:
    return await store.read(lambda tx: tx.fetchall(sql))


async def test_a_group_costs_a_few_statements_not_a_few_per_run(store: Store) -> None:
    group = [request(i, key=f"key{i}" if i % 2 else None) for i in range(40)]
    outcomes, statements = await submit(store, group)
    assert took_fast_path(statements)
    assert all(not ok(o).replayed for o in outcomes)
    # tenant quota, savepoint, request ids, keys, runs, events, (notify), keys, release
    assert len(statements) <= 10, statements
    assert len(await table(store, "SELECT id FROM runs")) == 40


async def test_a_key_twice_in_one_group_answers_the_second_as_a_replay(store: Store) -> None:
    group = [
        request(0, key="k"),
        request(1, key="k"),  # same body: a replay of the first
        request(2, key="k", body="other"),  # a different body: refused
        request(3, key="k", tenant="t2"),  # another tenant's key of the same name
    ]
    outcomes, statements = await submit(store, group)
    assert took_fast_path(statements)
    first, second, third, fourth = outcomes
    first_ = ok(first)
    assert not first_.replayed
    assert ok(second).replayed and ok(second).run.id == first_.run.id
    assert ok(second).response == first_.response
    assert isinstance(third, IdempotencyMismatch)
    assert not ok(fourth).replayed and ok(fourth).run.id != first_.run.id
    keys = await table(store, "SELECT tenant_id, key, run_id FROM idempotency_keys ORDER BY 1")
    assert keys == [
        {"tenant_id": "t1", "key": "k", "run_id": first_.run.id},
        {"tenant_id": "t2", "key": "k", "run_id": ok(fourth).run.id},
    ]
    assert len(await table(store, "SELECT id FROM runs")) == 2


async def test_a_key_of_an_earlier_group_is_replayed_or_refused(store: Store) -> None:
    earlier, _ = await submit(store, [request(0, key="k", tag="a")])
    outcomes, statements = await submit(
        store,
        [
            request(0, key="k", tag="b"),  # same body: the earlier run, its response
            request(1, key="k", body="other", tag="b"),  # a different body
            request(2, key="k2", tag="b"),  # a new key
            request(3, key="k", tag="b"),  # the earlier run again
        ],
    )
    assert took_fast_path(statements)
    first = ok(earlier[0])
    assert ok(outcomes[0]).replayed and ok(outcomes[0]).run.id == first.run.id
    assert ok(outcomes[0]).response == first.response
    assert isinstance(outcomes[1], IdempotencyMismatch)
    assert not ok(outcomes[2]).replayed
    assert ok(outcomes[3]).replayed and ok(outcomes[3]).run.id == first.run.id
    assert len(await table(store, "SELECT id FROM runs")) == 2


async def test_an_expired_key_of_an_earlier_group_is_replaced(store: Store) -> None:
    gone = request(0, key="k", tag="a")
    gone.idem = IdempotencyRequest("k", "fp-same", 0.0)  # expired as soon as written
    earlier, _ = await submit(store, [gone])
    outcomes, statements = await submit(store, [request(0, key="k"), request(1, key="k")])
    assert took_fast_path(statements)
    new = ok(outcomes[0])
    assert not new.replayed and new.run.id != ok(earlier[0]).run.id
    assert ok(outcomes[1]).replayed and ok(outcomes[1]).run.id == new.run.id
    keys = await table(store, "SELECT key, run_id FROM idempotency_keys")
    assert keys == [{"key": "k", "run_id": new.run.id}]


async def test_a_retried_group_answers_its_committed_runs(store: Store) -> None:
    group = [request(i, key=f"k{i}" if i % 2 else None) for i in range(4)]
    before, _ = await submit(store, group[:2])
    outcomes, statements = await submit(store, group)  # as after a lost COMMIT reply
    assert took_fast_path(statements)
    assert [ok(o).run.id for o in outcomes[:2]] == [ok(o).run.id for o in before]
    assert not any(ok(o).replayed for o in outcomes)
    assert len(await table(store, "SELECT id FROM runs")) == 4


async def test_one_request_id_twice_in_a_group_makes_one_run(store: Store) -> None:
    """Never sent by the service (each POST has its own request id), but a group holding
    one twice still writes one run: the group's INSERT meets the unique index, and
    accepted again alone, the second submit answers the run the first made."""
    group = [request(0), request(1), request(0)]
    outcomes, statements = await submit(store, group)
    assert "ROLLBACK TO SAVEPOINT accept_group" in statements
    assert ok(outcomes[2]).run.id == ok(outcomes[0]).run.id != ok(outcomes[1]).run.id
    assert not any(ok(o).replayed for o in outcomes)
    assert len(await table(store, "SELECT id FROM runs")) == 2
    assert len(await table(store, "SELECT id FROM events")) == 4


async def test_the_quota_refuses_mid_group_and_a_replay_needs_no_quota(store: Store) -> None:
    quota = Quota(runs_per_minute=3)
    await submit(store, [request(0, key="old", quota=quota, tag="a")])
    group = [
        request(1, key="k1", quota=quota),
        request(2, key="k2", quota=quota),  # the third run of the minute: the last one
        request(3, key="k3", quota=quota),  # refused
        request(4, quota=quota),  # refused
        request(5, key="old", quota=quota, tag="a0"),  # a replay: no new run, no quota
        request(6, key="k3", quota=quota),  # still refused: k3 was never written
        request(7, quota=quota, tenant="t2"),  # another tenant's quota
    ]
    outcomes, statements = await submit(store, group)
    assert took_fast_path(statements)
    assert not ok(outcomes[0]).replayed and not ok(outcomes[1]).replayed
    assert isinstance(outcomes[2], QuotaExceeded) and isinstance(outcomes[3], QuotaExceeded)
    assert ok(outcomes[4]).replayed
    assert isinstance(outcomes[5], QuotaExceeded)
    assert not ok(outcomes[6]).replayed
    keys = await table(store, "SELECT key FROM idempotency_keys ORDER BY key")
    assert [k["key"] for k in keys] == ["k1", "k2", "old"]
    assert len(await table(store, "SELECT id FROM runs")) == 4


async def test_a_failing_statement_accepts_each_submit_again_alone(
    store: Store,
) -> None:
    """A statement of the set-based path fails (here: the key row of the second submit
    appears, written on the same connection, between the read and the INSERT): its
    savepoint is rolled back -- the row with it -- and every submit of the group is
    accepted again alone, each under its own savepoint."""
    injected: list[bool] = []

    def injecting(run: Any) -> dict[str, Any]:
        if not injected:
            injected.append(True)
            conn = holder[0]
            store.dialect.execute(
                conn,
                "INSERT INTO idempotency_keys (tenant_id, key, fingerprint, run_id, "
                "status_code, response, created_at, expires_at) VALUES ('t1', 'k1', 'fp', "
                "'r-none', 202, '{}', 0, 1e12)",
            )
        return respond(run)

    holder: list[Any] = []
    group = [request(0, key="k0"), request(1, key="k1"), request(2)]
    group[0].respond = injecting

    def job(tx: Tx) -> Any:
        holder.append(tx.conn)
        counting = Counting(tx.dialect)
        return accepting.accept(Tx(counting, tx.conn), group), counting.statements  # type: ignore[arg-type]

    outcomes, statements = await store.transact(job)
    assert "ROLLBACK TO SAVEPOINT accept_group" in statements
    assert "SAVEPOINT accept0" in statements  # each alone
    assert all(not ok(o).replayed for o in outcomes)
    keys = await table(store, "SELECT key, run_id FROM idempotency_keys ORDER BY key")
    assert keys == [
        {"key": "k0", "run_id": ok(outcomes[0]).run.id},
        {"key": "k1", "run_id": ok(outcomes[1]).run.id},
    ]
    assert len(await table(store, "SELECT id FROM runs")) == 3
    events = await table(store, "SELECT type, seq FROM events ORDER BY id")
    assert [(e["type"], e["seq"]) for e in events] == [
        ("run.submitted", 1), ("run.accepted", 2),
    ] * 3  # fmt: skip


@pytest.mark.postgres
async def test_a_key_committed_by_another_connection_fails_alone_in_the_fallback(
    pg_url: str,
) -> None:
    """Another process commits the group's second key between the group's read and its
    INSERT: the set-based INSERT meets the unique index, the group falls back, and the
    second submit replays the other process's run while the others are accepted."""
    store = open_store(pg_url)
    await store.open()
    other: list[Any] = []

    def racing(run: Any) -> dict[str, Any]:
        if not other:  # the first call: after the read, before the key rows are written
            d2 = store.dialect
            c2 = d2.connect()
            try:
                theirs = SubmitRequest(
                    request(9, tag="other").new, {"user_id": "bob"}, None,
                    IdempotencyRequest("k1", "fp-same", 3600.0), Quota(), respond,
                )  # fmt: skip
                done = accepting.accept(Tx(d2, c2), [theirs])[0]
                c2.commit()
            finally:
                c2.close()
            other.append(done)
        return respond(run)

    try:
        group = [request(0, key="k0"), request(1, key="k1"), request(2)]
        group[0].respond = racing
        outcomes, statements = await submit(store, group)
        assert "ROLLBACK TO SAVEPOINT accept_group" in statements
        theirs = ok(other[0])
        assert not ok(outcomes[0]).replayed and not ok(outcomes[2]).replayed
        assert ok(outcomes[1]).replayed and ok(outcomes[1]).run.id == theirs.run.id
        assert ok(outcomes[1]).response == theirs.response
        runs = await table(store, "SELECT id FROM runs")
        assert len(runs) == 3  # theirs, and two of the group
    finally:
        await store.close()


# -- the rows an accept writes, grouped or alone ----------------------------------------


def varied_group(tag: str) -> list[SubmitRequest]:
    quota = Quota(runs_per_minute=5, max_in_flight=100)
    return [
        request(0, key="a", quota=quota, tag=tag),
        request(1, quota=quota, webhook="http://127.0.0.1:9/hook", tag=tag),
        request(2, key="a", quota=quota, tag=tag),  # replay within the group
        request(3, key="a", body="other", quota=quota, tag=tag),  # mismatch
        request(4, key="b", tenant="t2", quota=quota, tag=tag),
        request(5, key="old", quota=quota, tag=tag),  # replay of the earlier group
        request(6, key="c", quota=quota, tag=tag),
        request(7, quota=quota, tag=tag),
        request(8, key="d", quota=quota, tag=tag),  # 6th of t1 this minute: refused
        request(9, quota=quota, tag=tag),  # refused
    ]


def comparable(
    rows_: list[dict[str, Any]], drop: set[str], run_ids: dict[str, str]
) -> list[dict[str, Any]]:
    """Rows without ids and timestamps, run ids replaced by their runs' request ids."""
    out = []
    for row in rows_:
        clean = {}
        for name, value in row.items():
            if name in drop:
                continue
            if isinstance(value, str) and value in run_ids:
                value = run_ids[value]
            clean[name] = value
        out.append(clean)
    return out


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in response.items() if k not in ("id", "created_at")}


def outcome_view(outcome: Submitted | BaseException, run_ids: dict[str, str]) -> Any:
    if isinstance(outcome, BaseException):
        return (type(outcome).__name__, str(outcome))
    drop = ("id", "created_at", "updated_at", "available_at")
    run = {k: v for k, v in vars(outcome.run).items() if k not in drop}
    response = without_ids(outcome.response)
    return (run_ids[outcome.run.id], outcome.replayed, run, response)


async def rows_after(url: str, grouped: bool) -> dict[str, Any]:
    """``varied_group`` accepted as one group, or each submit in its own transaction:
    the rows written, the answers, and the audit chain once sealed."""
    store = open_store(url)
    await store.open()
    try:
        await submit(store, [request(0, key="old", tag="early")])
        if grouped:
            outcomes, statements = await submit(store, varied_group("g"))
            assert took_fast_path(statements)
        else:
            outcomes = []
            for r in varied_group("g"):
                outcomes += (await submit(store, [r]))[0]
        # The events are written unsealed, on every backend; the sealer chains them.
        unsealed = await table(store, "SELECT id FROM events WHERE hash IS NULL")
        assert len(unsealed) == 12, unsealed  # 6 runs, 2 events each
        assert await sealer.seal_once(store) == 12
        checked, broken = await store.read(lambda tx: service_audit.verify_chain(tx))
        assert checked == 12 and broken == [], broken
        runs = await table(store, "SELECT * FROM runs ORDER BY request_id")
        run_ids = {r["id"]: r["request_id"] for r in runs}
        return {
            "runs": comparable(runs, {"id", "created_at", "updated_at", "available_at"}, run_ids),
            "events": sorted(
                comparable(
                    await table(store, "SELECT * FROM events"),
                    {"id", "at", "prev_hash", "hash", "chain_no"},  # a hash covers its time
                    run_ids,
                ),
                key=lambda e: (e["run_id"], e["seq"]),
            ),
            "keys": comparable(
                [
                    {**k, "response": without_ids(json.loads(k["response"]))}
                    for k in await table(
                        store, "SELECT * FROM idempotency_keys ORDER BY tenant_id, key"
                    )
                ],
                {"created_at", "expires_at"},
                run_ids,
            ),
            "heads": await table(
                store, "SELECT tenant_id, chain_no FROM audit_heads ORDER BY tenant_id"
            ),
            "outcomes": [outcome_view(o, run_ids) for o in outcomes],
        }
    finally:
        await store.close()


@pytest.fixture
def two_urls(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    if backend == "sqlite":
        yield [f"sqlite:///{tmp_path / 'grouped.db'}", f"sqlite:///{tmp_path / 'alone.db'}"]
        return
    request.getfixturevalue("_pg_session")
    urls = [dbutil.make_pg_database(), dbutil.make_pg_database()]
    try:
        yield urls
    finally:
        for url in urls:
            dbutil.drop_pg_database(url)


async def test_an_accept_writes_these_rows_and_answers(two_urls: list[str]) -> None:
    """What each submit of a varied group gets and leaves, stated; and the same whether
    the submits shared one transaction or each had its own."""
    grouped = await rows_after(two_urls[0], grouped=True)
    outcomes = grouped["outcomes"]
    new = [(o[0], o[1]) for o in outcomes if isinstance(o[1], bool) and not o[1]]
    assert new == [("qg_0", False), ("qg_1", False), ("qg_4", False), ("qg_6", False),
                   ("qg_7", False)]  # fmt: skip
    assert outcomes[2][:2] == ("qg_0", True)  # a replay of the group's own run
    assert outcomes[2][3] == outcomes[0][3]  # with its response
    assert outcomes[3] == (
        "IdempotencyMismatch", "Idempotency-Key 'a' was used with a different request body"
    )  # fmt: skip
    assert outcomes[5][:2] == ("qearly_0", True)  # a replay of an earlier group's run
    for refused in (outcomes[8], outcomes[9]):
        assert refused == (
            "QuotaExceeded", "tenant t1 started 5 runs in the last minute (limit 5)"
        )  # fmt: skip
    runs = {r["request_id"]: r for r in grouped["runs"]}
    assert sorted(runs) == ["qearly_0", "qg_0", "qg_1", "qg_4", "qg_6", "qg_7"]
    assert runs["qg_1"]["webhook"] == "http://127.0.0.1:9/hook"
    assert runs["qg_0"]["idempotency_key"] == "a" and runs["qg_1"]["idempotency_key"] is None
    assert json.loads(runs["qg_4"]["principal"]) == {
        "user_id": "user0", "key_id": "k4", "roles": ["operator"]
    }  # fmt: skip
    assert {(r["status"], r["event_seq"]) for r in runs.values()} == {("queued", 2)}
    events = [e for e in grouped["events"] if e["run_id"] == "qg_1"]
    assert [(e["seq"], e["type"], e["actor"]) for e in events] == [
        (1, "run.submitted", "user1"), (2, "run.accepted", "user1"),
    ]  # fmt: skip
    assert json.loads(events[0]["data"]) == {"input": {"i": 1, "body": "same"}}
    assert json.loads(events[1]["data"]) == {
        "key_id": "k1", "roles": ["operator"], "request_id": "req1", "idempotency_key": None,
        "webhook": "http://127.0.0.1:9/hook",
    }  # fmt: skip
    assert [(k["tenant_id"], k["key"], k["run_id"]) for k in grouped["keys"]] == [
        ("t1", "a", "qg_0"), ("t1", "c", "qg_6"), ("t1", "old", "qearly_0"),
        ("t2", "b", "qg_4"),
    ]  # fmt: skip
    assert grouped["heads"] == [
        {"tenant_id": "t1", "chain_no": 10}, {"tenant_id": "t2", "chain_no": 2},
    ]  # fmt: skip
    alone = await rows_after(two_urls[1], grouped=False)
    for part in ("runs", "events", "keys", "heads", "outcomes"):
        assert grouped[part] == alone[part], part


@pytest.mark.postgres
async def test_a_connection_lost_in_the_fast_path_retries_the_whole_group(
    proxy: LossyProxy,
) -> None:
    """The connection drops during the set-based INSERTs (the server ran the statement,
    its reply never came back): no fallback on a dead connection -- the error reaches
    the store, which retries the whole group on a new connection (nothing committed):
    one run per submit, each with its events and key row."""
    store = open_store(proxy.url)
    await store.open()
    try:
        group = [request(i, key=f"k{i}" if i % 2 else None) for i in range(5)]
        proxy.arm(b"INSERT INTO idempotency_keys", READY_FOR_QUERY)
        outcomes, statements = await submit(store, group)
        assert proxy.cut.is_set()
        assert took_fast_path(statements)  # the retry's own statements
        assert all(not ok(o).replayed for o in outcomes)
        runs = await table(store, "SELECT id FROM runs ORDER BY id")
        assert [r["id"] for r in runs] == sorted(ok(o).run.id for o in outcomes)
        events = await table(store, "SELECT run_id FROM events")
        assert len(events) == 10
        keys = await table(store, "SELECT key FROM idempotency_keys ORDER BY key")
        assert [k["key"] for k in keys] == ["k1", "k3"]
    finally:
        await store.close()
