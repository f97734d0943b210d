"""The accept group's events chained at insert (service_audit.chain_at_insert, SQLite)
against what verify_chain recomputes from the stored rows: odd text, many tenants,
replays and refusals mixed in, a group rolled back to its savepoint, events another
writer left unsealed, and ``agentledger audit verify`` on the file."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from agentledger.store import SQLStore
from agentledger.store.dialect import Dialect
from agentledger.store.queries import service_audit, service_runs
from agentledger.store.queries.events import insert_event
from agentledger.store.queries.service_runs import (
    IdempotencyMismatch,
    IdempotencyRequest,
    SubmitRequest,
)
from tests.service.test_accept_group_fast import ok, request, submit, table, took_fast_path

ODD = [
    "nul\x00inside",
    "lone \ud800 surrogate",
    "trailing \udfff",
    "caf\u00e9 \u4e2d\u6587 \U0001f600",
    'quote" back\\slash\n',
    "",
]


def odd_request(i: int, tenant: str, key: str | None = None, tag: str = "") -> SubmitRequest:
    r = request(i, key=key, tenant=tenant, tag=tag)
    text = ODD[i % len(ODD)]
    r.new.user_id = text or None  # "" -> the "api" actor
    r.new.input = {"text": text, "n": i, "big": "x" * (1000 if i % 7 == 0 else 1)}
    r.principal = {"user_id": ODD[(i + 1) % len(ODD)], "key_id": f"k{i}", "roles": ["x"]}
    return r


async def intact(store: SQLStore) -> int:
    checked, broken = await store.transact(
        lambda d, c: service_audit.verify_chain(d, c), write=False
    )
    assert broken == [], broken
    return int(checked)


async def test_odd_text_many_tenants_replays_and_refusals_verify(store: SQLStore) -> None:
    tenants = [f"t{i}" for i in range(40)] + ["T0", "caf\u00e9", "a'b", "sp ace", "x" * 200]
    await submit(store, [odd_request(0, "t0", key="old", tag="a")])
    group = [odd_request(i, tenants[i % len(tenants)], tag="b") for i in range(120)]
    group.append(odd_request(0, "t0", key="old", tag="a0"))  # a replay
    mismatch = odd_request(1, "t0", key="old", tag="c")
    mismatch.idem = IdempotencyRequest("old", "fp-other", 3600.0)
    group.append(mismatch)  # a refusal
    outcomes, statements = await submit(store, group)
    assert took_fast_path(statements)
    assert ok(outcomes[120]).replayed
    assert isinstance(outcomes[121], IdempotencyMismatch)
    if store.dialect.name != "sqlite":
        await store.transact(lambda d, c: service_audit.seal(d, c))
    n_events = len(await table(store, "SELECT id FROM events"))
    assert await intact(store) == n_events == 2 * 121
    assert (await table(store, "SELECT COUNT(*) AS n FROM events WHERE hash IS NULL"))[0]["n"] == 0


async def test_a_group_rolled_back_to_its_savepoint_moves_no_head(store: SQLStore) -> None:
    """The fast path chains, then its key INSERT fails: the savepoint takes the head back
    with the rows, and the per-request path's events are chained once, with no gap."""
    await submit(store, [request(50, tag="first")])
    holder: list[Any] = []

    def injecting(run: Any) -> dict[str, Any]:
        if len(holder) == 1:
            holder.append(True)
            store.dialect.execute(
                holder[0],
                "INSERT INTO idempotency_keys (tenant_id, key, fingerprint, run_id, "
                "status_code, response, created_at, expires_at) VALUES ('t1', 'k1', 'fp', "
                "'r-none', 202, '{}', 0, 1e12)",
            )
        return {"id": run.id}

    group = [request(0, key="k0"), request(1, key="k1"), request(2, tenant="t2")]
    group[0].respond = injecting

    def job(d: Dialect, c: Any) -> Any:
        holder.append(c)
        return service_runs.submit_group(d, c, group)

    await store.transact(job)
    await store.transact(lambda d, c: service_audit.seal(d, c))
    assert await intact(store) == 8
    heads = await table(store, "SELECT tenant_id, chain_no FROM audit_heads ORDER BY 1")
    assert heads == [{"tenant_id": "t1", "chain_no": 6}, {"tenant_id": "t2", "chain_no": 2}]


async def test_unsealed_events_of_another_writer_then_a_group_then_a_seal(
    store: SQLStore,
) -> None:
    first, _ = await submit(store, [request(0), request(1, tenant="t2")])
    run_id = ok(first[0]).run.id
    # Written by a worker's journal: unsealed until a sealer passes.
    await store.transact(
        lambda d, c: insert_event(d, c, run_id, "run.started", "w\x00rker", {"x": "\ud800"})
    )
    await submit(store, [request(i, tag="g2") for i in range(2, 6)])
    await store.transact(
        lambda d, c: insert_event(d, c, run_id, "run.completed", "worker", {"r": 1})
    )
    await store.transact(lambda d, c: service_audit.seal(d, c))
    await submit(store, [request(i, tag="g3") for i in range(6, 8)])
    await store.transact(lambda d, c: service_audit.seal(d, c))
    assert await intact(store) == 2 * 8 + 2


async def test_audit_verify_command_on_a_file_written_by_the_fast_path(
    store: SQLStore, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Signed as they are chained, and checked by a verify in another process.
    monkeypatch.setenv("AGENTLEDGER_AUDIT_KEY", "k" * 32)
    await submit(store, [odd_request(i, f"t{i % 3}") for i in range(30)])
    await store.close()
    env = {**os.environ}
    done = subprocess.run(
        [sys.executable, "-m", "agentledger.cli.main", "audit", "verify", "--db", store_url],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "intact" in done.stdout and "signatures verified" in done.stdout
    await store.open()


async def test_a_tenant_id_the_store_cleans_keeps_the_fast_path(store: SQLStore) -> None:
    """A tenant id with a NUL or a lone surrogate is stored cleaned (U+FFFD, as every
    text parameter): its heads row is found under the cleaned id, so the group is not
    sent to the per-request path every time, and the chain verifies."""
    for tenant in ("n\x00ul", "s\ud800x"):
        outcomes, statements = await submit(store, [request(i, tenant=tenant, tag=tenant)
                                                    for i in range(3)])  # fmt: skip
        assert took_fast_path(statements), tenant
        assert all(ok(o) for o in outcomes)
    if store.dialect.name != "sqlite":
        await store.transact(lambda d, c: service_audit.seal(d, c))
    assert await intact(store) == 12
