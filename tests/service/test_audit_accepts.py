"""The accept group's events, chained by the sealer, against what verify_chain
recomputes from the stored rows: odd text, many tenants, replays and refusals mixed in,
a group rolled back to its savepoint, events of other writers in between, ``agentledger
audit verify`` on the file, and chains written at insert by earlier releases."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest

from agentledger.service import _accepting as accepting
from agentledger.service._accepting import (
    IdempotencyMismatch,
    IdempotencyRequest,
    SubmitRequest,
)
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from agentledger.store._queries.events import insert_event
from agentledger.store._tx import Tx
from tests.cli.helpers import cli_here
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


async def intact(store: Store) -> int:
    checked, broken = await store.read(lambda tx: service_audit.verify_chain(tx))
    assert broken == [], broken
    return int(checked)


async def test_odd_text_many_tenants_replays_and_refusals_verify(store: Store) -> None:
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
    await store.transact(service_audit.seal)
    n_events = len(await table(store, "SELECT id FROM events"))
    assert await intact(store) == n_events == 2 * 121
    assert (await table(store, "SELECT COUNT(*) AS n FROM events WHERE hash IS NULL"))[0]["n"] == 0


async def test_a_group_rolled_back_to_its_savepoint_moves_no_head(store: Store) -> None:
    """The group's key INSERT fails: the savepoint takes its rows back, each submit is
    accepted again alone, and the sealer chains every event once, with no gap."""
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

    def job(tx: Tx) -> Any:
        holder.append(tx.conn)
        return accepting.accept(tx, group)

    await store.transact(job)
    await store.transact(service_audit.seal)
    assert await intact(store) == 8
    heads = await table(store, "SELECT tenant_id, chain_no FROM audit_heads ORDER BY 1")
    assert heads == [{"tenant_id": "t1", "chain_no": 6}, {"tenant_id": "t2", "chain_no": 2}]


async def test_unsealed_events_of_another_writer_then_a_group_then_a_seal(
    store: Store,
) -> None:
    first, _ = await submit(store, [request(0), request(1, tenant="t2")])
    run_id = ok(first[0]).run.id
    # Written by a worker's journal: unsealed until a sealer passes.
    await store.transact(insert_event, run_id, "run.started", "w\x00rker", {"x": "\ud800"})
    await submit(store, [request(i, tag="g2") for i in range(2, 6)])
    await store.transact(insert_event, run_id, "run.completed", "worker", {"r": 1})
    await store.transact(service_audit.seal)
    await submit(store, [request(i, tag="g3") for i in range(6, 8)])
    await store.transact(service_audit.seal)
    assert await intact(store) == 2 * 8 + 2


async def test_audit_verify_command_on_a_file_of_accepts(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Signed as they are chained, and checked by a verify in another process.
    monkeypatch.setenv("AGENTLEDGER_AUDIT_KEY", "k" * 32)
    await submit(store, [odd_request(i, f"t{i % 3}") for i in range(30)])
    await store.transact(service_audit.seal)
    await store.close()
    env = {**os.environ}
    done = subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", "audit", "verify", "--db", store_url],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "intact" in done.stdout and "signatures verified" in done.stdout
    await store.open()


async def test_a_tenant_id_the_store_cleans_keeps_the_group_whole(store: Store) -> None:
    """A tenant id with a NUL or a lone surrogate is stored cleaned (U+FFFD, as every
    text parameter): the group is accepted whole, and its chain verifies."""
    for tenant in ("n\x00ul", "s\ud800x"):
        outcomes, statements = await submit(store, [request(i, tenant=tenant, tag=tenant)
                                                    for i in range(3)])  # fmt: skip
        assert took_fast_path(statements), tenant
        assert all(ok(o) for o in outcomes)
    await store.transact(service_audit.seal)
    assert await intact(store) == 12


# -- chains written at insert ------------------------------------------------------------
# Earlier releases inserted an SQLite accept group's events already chained: each
# tenant's head read and moved inside the accepting transaction, and the records hashed
# over their text as stored. Such files must keep verifying, and new records (sealed)
# must extend those chains.


def _chained_at_insert(tx: Tx, tenant: str, run_id: str, key: Any) -> None:
    """``run.submitted`` and ``run.accepted`` of ``run_id`` inserted chained, as earlier
    releases wrote them (``service_audit.chain_at_insert``)."""
    head = tx.fetchall(
        "SELECT chain_no, hash FROM audit_heads WHERE tenant_id = :t",
                      {"t": tenant})  # fmt: skip
    if not head:
        tx.execute(
            "INSERT INTO audit_heads (tenant_id, chain_no, hash) VALUES (:t, 0, :g)",
                  {"t": tenant, "g": service_audit.GENESIS})  # fmt: skip
        chain_no, prev = 0, service_audit.GENESIS
    else:
        chain_no, prev = int(head[0]["chain_no"]), str(head[0]["hash"])
    at = 1_700_000_000.123456
    sig = None
    for seq, type_, data in ((1, "run.submitted", '{"input":{}}'), (2, "run.accepted", "{}")):
        chain_no += 1
        row = {"run_id": run_id, "seq": seq, "type": type_, "actor": "alice", "at": at,
               "data": data}  # fmt: skip
        # Earlier releases hashed in the chain's earlier encoding (``hash_v`` NULL).
        digest = service_audit.record_hash(prev, tenant, row, chain_no, version=None)
        sig = key.sign(tenant, chain_no, digest) if key is not None else None
        tx.execute(
            "INSERT INTO events (run_id, at, type, actor, data, seq, token, tenant_id, "
            "chain_no, prev_hash, hash, sig) VALUES (:run_id, :at, :type, :actor, :data, "
            ":seq, NULL, :t, :n, :p, :h, :s)",
            {**row, "t": tenant, "n": chain_no, "p": prev, "h": digest, "s": sig},
        )
        prev = digest
    tx.execute("UPDATE runs SET event_seq = 2 WHERE id = :id", {"id": run_id})
    tx.execute(
        "UPDATE audit_heads SET chain_no = :n, hash = :h, sig = :s WHERE tenant_id = :t",
              {"n": chain_no, "h": prev, "s": sig, "t": tenant})  # fmt: skip


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
async def test_chains_written_at_insert_still_verify_and_are_extended(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch, signed: bool
) -> None:
    from agentledger import _auditkey as auditkey
    from agentledger.store import NewRun

    if signed:
        monkeypatch.setenv("AGENTLEDGER_AUDIT_KEY", "k" * 32)
    key = auditkey.configured()
    old_runs = []
    for i in range(6):
        tenant = f"t{i % 2}"
        new = NewRun("workflow", "free", "1", {}, tenant_id=tenant, request_id=f"old{i}")
        params = await store.transact(lambda tx, new=new: tx.fetchall(
            "INSERT INTO runs (id, tenant_id, kind, name, version, target, input, status, "
            "created_at, updated_at, available_at, request_id, event_seq) VALUES (:id, :t, "
            "'workflow', 'free', '1', 'free@1', '{}', 'queued', 0, 0, 0, :rid, 0) RETURNING id",
            {"id": f"r-old-{i}", "t": new.tenant_id, "rid": new.request_id},
        ))  # fmt: skip
        run_id = params[0]["id"]
        old_runs.append(run_id)
        await store.transact(lambda tx, t=tenant, r=run_id: _chained_at_insert(tx, t, r, key))
        if i == 2:  # a worker's event, left unsealed between two chained groups
            await store.transact(
                lambda tx, r=run_id: insert_event(tx, r, "run.started", "worker", {})
            )
    before = await store.read(lambda tx: service_audit.checkpoint(tx))
    assert [h["chain_no"] for h in before] == [6, 6]
    assert await intact(store) == 12
    # New accepts: written unsealed, chained by the sealer after the old records.
    await submit(store, [request(i, tenant=f"t{i % 2}", tag="new") for i in range(4)])
    await store.transact(service_audit.seal)
    assert await intact(store) == 12 + 1 + 8
    broken = await store.read(lambda tx: service_audit.against_checkpoint(tx, before, key))
    assert broken == []
    await store.close()
    # The command (in this process: test_audit_verify_command_on_a_file_of_accepts runs
    # it in another one).
    done = await asyncio.to_thread(cli_here, "audit", "verify", "--db", store_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("intact" if signed else "consistent") in done.stdout
    assert "21 records checked" in done.stdout
    await store.open()
