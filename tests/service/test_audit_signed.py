"""The audit chain anchored outside the database: records signed under
AGENTLEDGER_AUDIT_KEY (a key the database does not hold) and checkpoints a user keeps
elsewhere. Each attack here is one a writer of the database can make with the public
hash function: cut the tail and move the head back, edit a record and recompute the
chain and its head, delete a whole tenant's records and its head."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentledger import _sealer as sealer
from agentledger.cli._main import cli
from agentledger.errors import UsageError
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from agentledger.store._tx import Tx
from tests.service import service_app

KEY = "0f9b6c1d2e3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c"
OTHER_KEY = "another-secret-of-at-least-thirty-two-characters"
ENV = "AGENTLEDGER_AUDIT_KEY"


def audit_cli(*args: str, key: str | None = KEY) -> Result:
    return CliRunner().invoke(cli, ["audit", *args], env={ENV: key})


async def run_cli(*args: str, key: str | None = KEY) -> Result:
    return await asyncio.to_thread(audit_cli, *args, key=key)


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process seals under KEY (as a deployment's workers and services would)."""
    monkeypatch.setenv(ENV, KEY)


async def _runs(store: Store, tenant: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        ids.append(await service_app.app.submit(store, "echo", {"text": str(i)}, tenant_id=tenant))
    return ids


async def _chain(store: Store, tenant: str) -> list[dict[str, Any]]:
    return await store.read(lambda tx: tx.fetchall(
            "SELECT id, run_id, seq, type, actor, at, data, chain_no, prev_hash, hash, sig "
            "FROM events WHERE tenant_id = :t AND chain_no IS NOT NULL ORDER BY chain_no",
            {"t": tenant},
        ))  # fmt: skip


async def _checkpoint(store_url: str, path: Path) -> dict[str, Any]:
    got = await run_cli("checkpoint", "--db", store_url)
    assert got.exit_code == 0, got.output
    path.write_text(got.stdout)
    return dict(json.loads(got.stdout))


async def _rewrite_stripped(store: Store, tenant: str, chain: list[dict[str, Any]]) -> None:
    """Rewrite records 2.. of ``chain`` (actor ``mallory``), re-chain them with the
    public hash function and remove their signatures and the head's."""

    def rewrite(tx: Tx) -> None:
        prev = chain[0]["hash"]
        for row in chain[1:]:
            digest = service_audit.record_hash(
                prev, tenant, {**row, "actor": "mallory"}, int(row["chain_no"])
            )
            tx.execute(
                "UPDATE events SET actor = 'mallory', prev_hash = :p, hash = :h, sig = NULL "
                "WHERE id = :id", {"p": prev, "h": digest, "id": row["id"]},
            )  # fmt: skip
            prev = digest
        tx.execute(
            "UPDATE audit_heads SET hash = :h, sig = NULL WHERE tenant_id = :t",
                  {"h": prev, "t": tenant})  # fmt: skip

    await store.transact(rewrite)


async def _sealed(store: Store) -> None:
    await sealer.seal_once(store)
    assert not await store.read(service_audit.has_unsealed)


async def test_seals_are_signed_and_verify_checks_them(
    keyed: None, store: Store, store_url: str
) -> None:
    await _runs(store, "t1", 2)
    await _sealed(store)
    chain = await _chain(store, "t1")
    assert chain and all(r["sig"] for r in chain)
    ok = await run_cli("verify", "--db", store_url)
    assert ok.exit_code == 0, ok.output
    assert "intact" in ok.output and "signatures verified" in ok.output


async def test_rewritten_and_rechained_record_fails_its_signature(
    keyed: None, store: Store, store_url: str
) -> None:
    """(b) Edit record 2 and recompute every later hash and the head with the public
    hash function: the hashes agree, the signature of record 2 does not."""
    await _runs(store, "t1", 2)
    await _runs(store, "t2", 1)
    await _sealed(store)
    chain = await _chain(store, "t1")
    victim = chain[1]

    def rewrite(tx: Tx) -> None:
        prev = chain[0]["hash"]
        for row in chain[1:]:
            row = dict(row)
            if row["id"] == victim["id"]:
                row["actor"] = "mallory"
            digest = service_audit.record_hash(prev, "t1", row, int(row["chain_no"]))
            tx.execute(
                "UPDATE events SET actor = :a, prev_hash = :p, hash = :h WHERE id = :id",
                {"a": row["actor"], "p": prev, "h": digest, "id": row["id"]},
            )  # fmt: skip
            prev = digest
        tx.execute("UPDATE audit_heads SET hash = :h WHERE tenant_id = 't1'", {"h": prev})

    await store.transact(rewrite)
    bad = await run_cli("verify", "--db", store_url, "--no-seal")
    assert bad.exit_code == 1, bad.output
    assert f"tenant t1, record 2 event {victim['id']}" in bad.output
    assert "signature" in bad.output and "t2" not in bad.output
    # Stripping the signatures instead is no way out: the chain ends unsigned.
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE events SET sig = NULL WHERE tenant_id = 't1' "
                               "AND chain_no >= 2")
    )  # fmt: skip
    stripped = await run_cli("verify", "--db", store_url, "--no-seal")
    assert stripped.exit_code == 1 and "tenant t1, record 2" in stripped.output
    assert "not signed" in stripped.output


async def test_cut_tail_with_head_moved_back_fails_against_a_checkpoint(
    keyed: None, store: Store, store_url: str, tmp_path: Path
) -> None:
    """(a) Delete the newest records and move the head back onto an earlier, genuinely
    signed record: only an anchor kept outside the database can tell."""
    await _runs(store, "t1", 3)
    await _runs(store, "t2", 1)
    await _sealed(store)
    saved = await _checkpoint(store_url, tmp_path / "cp.json")
    chain = await _chain(store, "t1")
    n = len(chain)
    assert next(h for h in saved["heads"] if h["tenant_id"] == "t1")["chain_no"] == n
    keep = chain[n - 3]  # the last run's ending records go

    def cut(tx: Tx) -> None:
        tx.execute(
            "DELETE FROM events WHERE tenant_id = 't1' AND chain_no > :k",
                  {"k": keep["chain_no"]})  # fmt: skip
        tx.execute(
            "UPDATE audit_heads SET chain_no = :n, hash = :h, sig = :s WHERE tenant_id = 't1'",
            {"n": keep["chain_no"], "h": keep["hash"], "s": keep["sig"]},
        )  # fmt: skip

    await store.transact(cut)
    bad = await run_cli("verify", "--db", store_url, "--no-seal", "--since-checkpoint",
                        str(tmp_path / "cp.json"))  # fmt: skip
    assert bad.exit_code == 1, bad.output
    assert f"tenant t1, record {n}" in bad.output and "truncated" in bad.output
    assert "t2" not in bad.output


async def test_deleted_tenant_is_named_by_its_runs_and_by_a_checkpoint(
    keyed: None, store: Store, store_url: str, tmp_path: Path
) -> None:
    """(c) Delete a whole tenant's records and its head: its runs name it; with its
    runs deleted too, the checkpoint does."""
    await _runs(store, "t1", 1)
    (gone,) = await _runs(store, "t2", 1)
    await _sealed(store)
    await _checkpoint(store_url, tmp_path / "cp.json")

    def wipe(tx: Tx) -> None:
        tx.execute("DELETE FROM events WHERE tenant_id = 't2'")
        tx.execute("DELETE FROM audit_heads WHERE tenant_id = 't2'")

    await store.transact(wipe)
    bad = await run_cli("verify", "--db", store_url, "--no-seal")
    assert bad.exit_code == 1, bad.output
    assert f"run {gone} (tenant t2) has no audit records" in bad.output
    await store.transact(lambda tx: tx.execute("DELETE FROM runs WHERE tenant_id = 't2'"))
    quiet = await run_cli("verify", "--db", store_url, "--no-seal")
    assert quiet.exit_code == 0, quiet.output  # nothing in the database says t2 existed
    bad = await run_cli("verify", "--db", store_url, "--no-seal", "--since-checkpoint",
                        str(tmp_path / "cp.json"))  # fmt: skip
    assert bad.exit_code == 1, bad.output
    assert "tenant t2" in bad.output and "gone" in bad.output


async def test_a_wrong_key_is_one_clear_error(keyed: None, store: Store, store_url: str) -> None:
    await _runs(store, "t1", 1)
    await _sealed(store)
    wrong = await run_cli("verify", "--db", store_url, key=OTHER_KEY)
    assert wrong.exit_code != 0
    assert isinstance(wrong.exception, UsageError)
    message = str(wrong.exception)
    assert ENV in message and "key id" in message and "TAMPERED" not in wrong.output
    short = await run_cli("verify", "--db", store_url, key="short")
    assert isinstance(short.exception, UsageError) and ENV in str(short.exception)


async def test_without_a_key_verify_says_unsigned_and_require_signed_fails(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    await _runs(store, "t1", 1)
    await _sealed(store)
    assert all(r["sig"] is None for r in await _chain(store, "t1"))
    soft = await run_cli("verify", "--db", store_url, key=None)
    assert soft.exit_code == 0, soft.output
    assert "intact" not in soft.output and f"set {ENV}" in soft.output
    hard = await run_cli("verify", "--db", store_url, "--require-signed", key=None)
    assert hard.exit_code == 1 and f"set {ENV}" in hard.output
    # With the key, the unsigned chain does not pass either, and a sealer with the key
    # does not extend it (signing after it would vouch for it) ...
    keyed = await run_cli("verify", "--db", store_url, "--no-seal")
    assert keyed.exit_code == 1 and "tenant t1, record 1" in keyed.output
    assert "not signed" in keyed.output and "sign-unsigned" in keyed.output
    await _runs(store, "t1", 1)
    monkeypatch.setenv(ENV, KEY)
    assert await sealer.seal_once(store) == 0
    # ... until an operator adopts it, after checking it.
    adopted = await run_cli("sign-unsigned", "--db", store_url)
    assert adopted.exit_code == 0 and "tenant t1: signed" in adopted.output, adopted.output
    assert await sealer.seal_once(store) > 0
    ok = await run_cli("verify", "--db", store_url, "--no-seal", "--require-signed")
    assert ok.exit_code == 0 and "signatures verified" in ok.output, ok.output


async def test_a_rewrite_with_its_signatures_stripped_is_not_blessed_by_the_next_seal(
    keyed: None, store: Store, store_url: str
) -> None:
    """Stripping the signatures of a rewritten chain (and its head's) must not let the
    next seal's signature vouch for it."""
    await _runs(store, "t1", 2)
    await _sealed(store)
    await _rewrite_stripped(store, "t1", await _chain(store, "t1"))
    await _runs(store, "t1", 1)
    assert await sealer.seal_once(store) == 0
    bad = await run_cli("verify", "--db", store_url)
    assert bad.exit_code == 1 and "tenant t1, record 2" in bad.output, bad.output
    assert "not signed" in bad.output and "not sealed yet" in bad.output


async def test_a_sealer_without_the_key_leaves_a_signed_chain_alone(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process started without the key must not extend a signed chain with unsigned
    records (they would end it unsigned); the records wait for a sealer with it."""
    monkeypatch.setenv(ENV, KEY)
    await _runs(store, "t1", 1)
    await _sealed(store)
    await _runs(store, "t1", 1)
    monkeypatch.delenv(ENV)
    assert await sealer.seal_once(store) == 0
    monkeypatch.setenv(ENV, OTHER_KEY)
    assert await sealer.seal_once(store) == 0
    monkeypatch.setenv(ENV, KEY)
    assert await sealer.seal_once(store) > 0
    ok = await run_cli("verify", "--db", store_url, "--no-seal")
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"format": "other"}',
     '{"format": "agentledger-audit-checkpoint/1", "heads": [{"tenant_id": "t1", '
     '"chain_no": 99999999999999999999, "hash": "x", "sig": null}]}'],
)  # fmt: skip
async def test_a_file_that_is_not_a_checkpoint_is_one_clear_error(
    keyed: None, store: Store, store_url: str, tmp_path: Path, text: str
) -> None:
    await _runs(store, "t1", 1)
    path = tmp_path / "cp.json"
    path.write_text(text)
    bad = await run_cli("verify", "--db", store_url, "--since-checkpoint", str(path))
    assert isinstance(bad.exception, UsageError), bad.output
    assert "is not an audit checkpoint" in str(bad.exception)
    assert "agentledger audit checkpoint" in str(bad.exception)
    # Nothing was read or sealed first.
    assert await store.read(service_audit.has_unsealed)
