"""A seal writes each record's link exactly as the chain's definition says, on both
stores, whatever the windows it is cut into: every record of the tenant, in id order,
gets the next position, the hash of the one before, its own hash over its fields and
its signature under the key -- compared here with the chain recomputed from the
records in Python, not only with ``verify_chain``. The links are written in one
statement on a server (its columns each sent as one array text), so a value's quoting
in that text would show here as a wrong hash or signature."""

from __future__ import annotations

from typing import Any

import pytest

from agentledger import _auditkey as auditkey
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from agentledger.store._tx import Tx
from tests.service import service_app
from tests.service.test_audit_signed import ENV, KEY

TENANT = 't"1\\,{x}'  # a tenant id that array text must quote and escape


def _records(tx: Tx) -> list[dict[str, Any]]:
    return tx.fetchall(
        "SELECT id, run_id, seq, type, actor, at, data, data_digest, tenant_id, chain_no, "
        "prev_hash, hash, sig, hash_v FROM events WHERE tenant_id = :t ORDER BY id",
        {"t": TENANT},
    )


def _head(tx: Tx) -> dict[str, Any]:
    return tx.fetchall(
        "SELECT chain_no, hash, sig FROM audit_heads WHERE tenant_id = :t", {"t": TENANT}
    )[0]


@pytest.mark.parametrize("window", [3, 500])
async def test_sealed_links_are_the_chain_recomputed_from_the_records(
    store: Store, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    monkeypatch.setenv(ENV, KEY)
    key = auditkey.configured()
    assert key is not None
    for i in range(4):
        run_id = await service_app.app.submit(
            store, "echo", {"text": f'say "{i}" \\ {{a,b}}'}, tenant_id=TENANT
        )
        await store.append_event(run_id, "note", 'an "actor", \\ too', {"n": i, "q": '"{}'})
    sealed = 0
    while True:
        done = await store.transact(service_audit.seal, window)
        sealed += done
        if done < window:
            break
    records = await store.read(_records)
    assert sealed == len(records) == 8
    prev = service_audit.GENESIS
    for n, row in enumerate(records, start=1):
        digest = service_audit.record_hash(prev, TENANT, row, n)
        assert (row["chain_no"], row["prev_hash"], row["hash"], row["hash_v"]) == (
            n, prev, digest, service_audit.HASH_CANONICAL,
        )  # fmt: skip
        assert row["sig"] == key.sign(TENANT, n, digest)
        prev = digest
    head = await store.read(_head)
    assert (head["chain_no"], head["hash"]) == (8, prev)
    assert head["sig"] == key.sign(TENANT, 8, prev)
    checked, broken = await store.read(service_audit.verify_chain, TENANT, key)
    assert broken == [] and checked == 8
