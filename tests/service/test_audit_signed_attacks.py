"""Attacks on the signed audit chain by a writer of the database who does not hold
AGENTLEDGER_AUDIT_KEY: each edits the tables directly, then runs what an operator
would (a sealer, `audit verify`, `audit sign-unsigned`)."""

from __future__ import annotations

from typing import Any

import pytest

from agentledger import _auditkey as auditkey
from agentledger import _sealer as sealer
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from agentledger.store._tx import Tx
from tests.service.test_audit_signed import (
    KEY,
    _chain,
    _rewrite_stripped,
    _runs,
    _sealed,
    keyed,
    run_cli,
)

__all__ = ["keyed"]  # the fixture, used by name


async def test_a_tenant_whose_head_was_deleted_is_still_verified(
    keyed: None, store: Store, store_url: str
) -> None:
    """verify walked the heads: deleting a tenant's head row hid its records from it,
    an edited record included."""
    await _runs(store, "t1", 2)
    await _runs(store, "t2", 1)
    await _sealed(store)
    victim = (await _chain(store, "t1"))[1]

    def tamper(tx: Tx) -> None:
        tx.execute("UPDATE events SET actor = 'mallory' WHERE id = :id", {"id": victim["id"]})
        tx.execute("DELETE FROM audit_heads WHERE tenant_id = 't1'")

    await store.transact(tamper)
    bad = await run_cli("verify", "--db", store_url, "--no-seal")
    assert bad.exit_code == 1, bad.output
    assert f"tenant t1, record 2 event {victim['id']}" in bad.output, bad.output
    assert "t2" not in bad.output
    # The edit undone, the missing head alone is named.
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE events SET actor = :a WHERE id = :id",
                               {"a": victim["actor"], "id": victim["id"]})
    )  # fmt: skip
    headless = await run_cli("verify", "--db", store_url, "--no-seal", "--tenant", "t1")
    assert headless.exit_code == 1, headless.output
    assert "tenant t1" in headless.output and "no head" in headless.output


async def test_sign_unsigned_does_not_adopt_records_whose_signatures_were_removed(
    keyed: None, store: Store, store_url: str
) -> None:
    """A rewrite whose signatures were stripped after a signed record is not a history
    sealed before the key: verify must not send the operator to sign-unsigned, and
    sign-unsigned must not sign it (it would launder the rewrite)."""
    await _runs(store, "t1", 2)
    await _sealed(store)
    await _rewrite_stripped(store, "t1", await _chain(store, "t1"))
    bad = await run_cli("verify", "--db", store_url, "--no-seal")
    assert bad.exit_code == 1 and "tenant t1, record 2" in bad.output, bad.output
    assert "signature was removed" in bad.output and "sign-unsigned" not in bad.output
    refused = await run_cli("sign-unsigned", "--db", store_url)
    assert refused.exit_code == 1, refused.output
    assert "tenant t1: record 2" in refused.output and "nothing was signed" in refused.output
    assert all(r["sig"] is None for r in (await _chain(store, "t1"))[1:])
    still = await run_cli("verify", "--db", store_url, "--no-seal")
    assert still.exit_code == 1 and "tenant t1, record 2" in still.output


async def test_a_sealer_does_not_extend_a_chain_whose_head_signature_is_forged(
    keyed: None, store: Store
) -> None:
    """The head's key id is public (logs, checkpoints): naming it on a rewritten,
    stripped chain's head must not make a sealer sign after that chain."""
    await _runs(store, "t1", 2)
    await _sealed(store)
    await _rewrite_stripped(store, "t1", await _chain(store, "t1"))
    key_id = auditkey.key_from_text(KEY).key_id
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE audit_heads SET sig = :s WHERE tenant_id = 't1'",
            {"s": f"{key_id}:{'0' * 64}"},
        )
    )  # fmt: skip
    await _runs(store, "t1", 1)
    assert await sealer.seal_once(store) == 0


async def test_a_signature_that_is_not_text_of_hex_is_reported_not_a_crash(
    keyed: None, store: Store, store_url: str, backend: str
) -> None:
    """Stored values a writer chose (non-ASCII in a signature; on SQLite, a BLOB in a
    TEXT column) make verify name the record, not end in a traceback."""
    await _runs(store, "t1", 2)
    await _runs(store, "t2", 1)
    await _sealed(store)
    chain = await _chain(store, "t1")
    key_id = auditkey.key_from_text(KEY).key_id
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE events SET sig = :s WHERE id = :id",
                               {"s": f"{key_id}:\u00e9", "id": chain[1]["id"]})
    )  # fmt: skip
    bad = await run_cli("verify", "--db", store_url, "--no-seal")
    assert bad.exit_code == 1 and isinstance(bad.exception, SystemExit), bad.exception
    assert "tenant t1, record 2" in bad.output and "signature" in bad.output, bad.output
    if backend != "sqlite":
        return
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE events SET sig = :s, data = CAST(data AS BLOB) WHERE id = :id",
            {"s": chain[1]["sig"], "id": chain[1]["id"]},
        )
    )  # fmt: skip
    blob = await run_cli("verify", "--db", store_url, "--no-seal")
    assert isinstance(blob.exception, SystemExit), blob.output
    assert "tenant t1, record 2" in blob.output and "t2" not in blob.output, blob.output


def test_the_key_is_not_in_its_repr() -> None:
    """A key object in a log line or an error reporter's captured locals shows its id."""
    key = auditkey.key_from_text(KEY)
    assert KEY not in repr(key) and repr(KEY.encode()) not in repr(key)
    assert key.key_id in repr(key)


@pytest.mark.parametrize("sig", [None, 7, "x"])
def test_verifies_is_false_for_a_signature_of_any_value(sig: Any) -> None:
    key = auditkey.key_from_text(KEY)
    assert not key.verifies("t1", 1, "0" * 64, sig)


async def test_a_run_moved_to_another_tenant_is_named(
    keyed: None, store: Store, store_url: str
) -> None:
    """Moving a sealed run into another tenant (whose users then read it) leaves every
    chain intact: the run's tenant must match the chain its records are sealed in."""
    (moved,) = await _runs(store, "t1", 1)
    await _runs(store, "t2", 1)
    await _sealed(store)
    ok = await run_cli("verify", "--db", store_url, "--no-seal")
    assert ok.exit_code == 0, ok.output
    await store.transact(
        lambda tx: tx.execute("UPDATE runs SET tenant_id = 't2' WHERE id = :r", {"r": moved})
    )
    bad = await run_cli("verify", "--db", store_url, "--no-seal")
    assert bad.exit_code == 1, bad.output
    assert f"run {moved} (tenant t2) has its audit records in tenant t1's chain" in bad.output
    scoped = await run_cli("verify", "--db", store_url, "--no-seal", "--tenant", "t2")
    assert scoped.exit_code == 1 and f"run {moved}" in scoped.output, scoped.output
    checkpoint = await run_cli("checkpoint", "--db", store_url, "--no-seal")
    assert checkpoint.exit_code == 1 and "no checkpoint taken" in checkpoint.output


async def test_sign_unsigned_says_what_it_signed_before_a_refusal(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenants are adopted one transaction each: a refused tenant must not hide that
    the ones before it were signed."""
    monkeypatch.delenv("AGENTLEDGER_AUDIT_KEY", raising=False)
    await _runs(store, "a", 1)
    await _sealed(store)
    monkeypatch.setenv("AGENTLEDGER_AUDIT_KEY", KEY)
    await _runs(store, "b", 2)
    await _sealed(store)
    await _rewrite_stripped(store, "b", await _chain(store, "b"))
    got = await run_cli("sign-unsigned", "--db", store_url)
    assert got.exit_code == 1, got.output
    assert "tenant a: signed" in got.output, got.output
    assert "tenant b: record 2" in got.output and "nothing was signed" in got.output
    assert all(r["sig"] for r in await _chain(store, "a"))


def _swap_tenants(tx: Tx, t1: list[dict[str, Any]], t2: list[dict[str, Any]]) -> None:
    tx.execute("UPDATE events SET tenant_id = 'x' WHERE tenant_id = 't1'")
    tx.execute("UPDATE events SET tenant_id = 't1' WHERE tenant_id = 't2'")
    tx.execute("UPDATE events SET tenant_id = 't2' WHERE tenant_id = 'x'")
    heads = {r["tenant_id"]: r for r in tx.fetchall("SELECT * FROM audit_heads")}
    for mine, theirs in (("t1", "t2"), ("t2", "t1")):
        h = heads[theirs]
        tx.execute(
            "UPDATE audit_heads SET chain_no = :n, hash = :h, sig = :s WHERE tenant_id = :t",
            {"n": h["chain_no"], "h": h["hash"], "s": h["sig"], "t": mine},
        )  # fmt: skip


def _move_other_tenants_record(tx: Tx, t1: list[dict[str, Any]], t2: list[dict[str, Any]]) -> None:
    """t2's record 2, with its hash and signature, moved to t1's position 2 (t1's own
    record 2 deleted)."""
    tx.execute("DELETE FROM events WHERE id = :i", {"i": t1[1]["id"]})
    tx.execute("UPDATE events SET tenant_id = 't1' WHERE id = :i", {"i": t2[1]["id"]})


def _swap_positions(tx: Tx, t1: list[dict[str, Any]], t2: list[dict[str, Any]]) -> None:
    """t1's records 2 and 3 trade places (each keeps its hash and signature)."""
    a, b = t1[1], t1[2]
    tx.execute("UPDATE events SET chain_no = -1 WHERE id = :i", {"i": a["id"]})
    tx.execute("UPDATE events SET chain_no = 2 WHERE id = :i", {"i": b["id"]})
    tx.execute("UPDATE events SET chain_no = 3 WHERE id = :i", {"i": a["id"]})


def _renumber(tx: Tx, t1: list[dict[str, Any]], t2: list[dict[str, Any]]) -> None:
    tx.execute("UPDATE events SET chain_no = chain_no + 1000 WHERE tenant_id = 't1'")
    tx.execute("UPDATE audit_heads SET chain_no = chain_no + 1000 WHERE tenant_id = 't1'")


def _rechain_without_record_2(tx: Tx, t1: list[dict[str, Any]], t2: list[dict[str, Any]]) -> None:
    """Record 2 deleted, the later ones renumbered and re-chained, keeping their
    signatures."""
    tx.execute("DELETE FROM events WHERE id = :i", {"i": t1[1]["id"]})
    prev = t1[0]["hash"]
    for no, row in enumerate(t1[2:], start=2):
        digest = service_audit.record_hash(prev, "t1", row, no)
        tx.execute(
            "UPDATE events SET chain_no = :n, prev_hash = :p, hash = :h WHERE id = :i",
            {"n": no, "p": prev, "h": digest, "i": row["id"]},
        )  # fmt: skip
        prev = digest
    tx.execute(
        "UPDATE audit_heads SET chain_no = :n, hash = :h WHERE tenant_id = 't1'",
        {"n": len(t1) - 1, "h": prev},
    )  # fmt: skip


def _tenant_nulled(tx: Tx, t1: list[dict[str, Any]], t2: list[dict[str, Any]]) -> None:
    tx.execute("UPDATE events SET tenant_id = NULL WHERE id = :i", {"i": t1[1]["id"]})


@pytest.mark.parametrize(
    "splice",
    [_swap_tenants, _move_other_tenants_record, _swap_positions, _renumber,
     _rechain_without_record_2, _tenant_nulled],
)  # fmt: skip
async def test_a_spliced_chain_fails_verify(
    keyed: None, store: Store, store_url: str, splice: Any
) -> None:
    """Signed records moved between tenants or positions, tenants' chains swapped, the
    numbering changed: each is named (the signature covers tenant, position and hash)."""
    await _runs(store, "t1", 3)
    await _runs(store, "t2", 3)
    await _sealed(store)
    t1, t2 = await _chain(store, "t1"), await _chain(store, "t2")
    assert len(t1) == len(t2) == 3
    await store.transact(splice, t1, t2)
    bad = await run_cli("verify", "--db", store_url, "--no-seal")
    assert bad.exit_code == 1 and isinstance(bad.exception, SystemExit), bad.output
    assert "TAMPERED: tenant t1" in bad.output and "None" not in bad.output, bad.output


async def test_a_head_whose_signature_is_forged_is_named_by_verify(
    keyed: None, store: Store, store_url: str
) -> None:
    """An intact chain under a head whose signature a writer replaced: sealers refuse
    to extend it, so verify must say why its records stay unsealed."""
    await _runs(store, "t1", 1)
    await _sealed(store)
    key_id = auditkey.key_from_text(KEY).key_id
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE audit_heads SET sig = :s WHERE tenant_id = 't1'",
            {"s": f"{key_id}:{'0' * 64}"},
        )
    )  # fmt: skip
    await _runs(store, "t1", 1)
    assert await sealer.seal_once(store) == 0
    bad = await run_cli("verify", "--db", store_url)
    assert bad.exit_code == 1, bad.output
    assert "TAMPERED: tenant t1" in bad.output and "head's signature" in bad.output
