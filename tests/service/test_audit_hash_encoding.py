"""The audit hash is computed over canonical JSON (agentledger/_canonical.py); chains
sealed before, in the chain's own encoding, keep verifying: each record names the
encoding that hashed it (``events.hash_v``)."""

from __future__ import annotations

import asyncio
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentledger import _sealer as sealer
from agentledger.cli._main import cli
from agentledger.service._queries import audit as service_audit
from agentledger.service._queries.audit import GENESIS, HASH_CANONICAL, record_hash
from agentledger.store import Store, open_store
from agentledger.store._tx import Tx
from tests.service import service_app

LEGACY_DUMP = Path(__file__).parent / "data" / "audit_before_canonical.sql"
LEGACY_KEY = "legacy-audit-key-of-at-least-thirty-two-chars"

ROW: dict[str, Any] = {
    "run_id": "r1",
    "seq": 1,
    "type": "run.submitted",
    "actor": "josé",
    "at": 1700000000.25,
    "data": '{"input":"x"}',
}


def _verify(url: str, key: str | None = LEGACY_KEY) -> Any:
    return CliRunner().invoke(
        cli, ["audit", "verify", "--db", url], env={"AGENTLEDGER_AUDIT_KEY": key}
    )


def _legacy_db(tmp_path: Path) -> str:
    path = tmp_path / "legacy.db"
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_DUMP.read_text())
    conn.close()
    return f"sqlite:///{path}"


def test_a_database_written_before_canonical_hashes_verifies(tmp_path: Path) -> None:
    url = _legacy_db(tmp_path)
    migrated = CliRunner().invoke(cli, ["migrate", "--db", url])
    assert migrated.exit_code == 0, migrated.output
    got = _verify(url)
    assert got.exit_code == 0, got.output
    assert "audit chain intact" in got.output and "signatures verified" in got.output


def test_a_chain_sealed_before_goes_on_in_canonical_json_and_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New records (and the one the old code left unsealed) are chained after the old
    ones in canonical JSON; verify checks each record in its own encoding."""
    monkeypatch.setenv("AGENTLEDGER_AUDIT_KEY", LEGACY_KEY)
    url = _legacy_db(tmp_path)

    async def more() -> list[dict[str, Any]]:
        store = open_store(url)
        await store.open()
        try:
            for tenant in ("acmé", "plain", "東京", "new"):
                await service_app.app.submit(
                    store, "echo", {"text": "ünïcode"}, tenant_id=tenant, user_id="zoë"
                )
            await sealer.seal_once(store)
            return await store.read(
                lambda tx: tx.fetchall(
                    "SELECT id, hash_v FROM events WHERE hash IS NOT NULL ORDER BY id"
                )
            )
        finally:
            await store.close()

    sealed = asyncio.run(more())
    assert [r["hash_v"] for r in sealed] == [None] * 4 + [HASH_CANONICAL] * 5
    got = _verify(url)
    assert got.exit_code == 0, got.output
    assert "audit chain intact" in got.output


def test_the_old_encoding_is_kept_byte_for_byte(tmp_path: Path) -> None:
    """The records of the old database hash, in the old encoding, to what the old code
    wrote (non-ASCII names, a DEL, quotes and a backslash among them)."""
    conn = sqlite3.connect(tmp_path / "x.db")
    conn.row_factory = sqlite3.Row
    conn.executescript(LEGACY_DUMP.read_text())
    rows = [dict(r) for r in conn.execute("SELECT * FROM events WHERE hash IS NOT NULL")]
    conn.close()
    assert len(rows) == 4
    for row in rows:
        legacy = record_hash(row["prev_hash"], row["tenant_id"], row, row["chain_no"], version=None)
        assert legacy == row["hash"]
        canonical = record_hash(row["prev_hash"], row["tenant_id"], row, row["chain_no"])
        assert canonical != row["hash"]  # the encodings differ: hence ``hash_v``


def _body(row: dict[str, Any], version: int | None) -> bytes:
    """The bytes a record's hash is taken over, after the previous hash and a newline."""
    seen: list[bytes] = []

    class Spy:
        def __init__(self, data: bytes) -> None:
            seen.append(data)

        def hexdigest(self) -> str:
            return ""

    real = service_audit.hashlib.sha256
    service_audit.hashlib.sha256 = Spy  # type: ignore[assignment]
    try:
        record_hash(GENESIS, "t", row, 1, version=version)
    finally:
        service_audit.hashlib.sha256 = real
    return seen[-1].split(b"\n", 1)[1]


@pytest.mark.parametrize(
    ("at", "encoded"),
    [(0.1, b"0.1"), (1e16, b"1e+16"), (-0.0, b"-0.0"), (1700000000, b"1700000000.0"),
     (None, b"null")],
)  # fmt: skip
def test_canonical_hash_encodes_the_time_as_a_json_number(at: Any, encoded: bytes) -> None:
    assert _body({**ROW, "at": at}, HASH_CANONICAL).split(b",")[6] == encoded


def test_canonical_hash_refuses_a_time_that_is_no_number() -> None:
    for at in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            record_hash(GENESIS, "t", {**ROW, "at": at}, 1)


def test_canonical_hash_takes_text_as_utf8_and_tells_different_values_apart() -> None:
    body = _body({**ROW, "actor": "josé 🙂"}, HASH_CANONICAL)
    assert "josé 🙂".encode() in body  # not ASCII-escaped
    assert b"\\u00e9" in _body({**ROW, "actor": "josé"}, None)  # the old encoding escaped
    distinct = {
        record_hash(GENESIS, "t", {**ROW, **change}, 1)
        for change in (
            {},
            {"actor": "a\x00"},
            {"actor": "a\ufffd"},  # NUL is not sanitized into U+FFFD for the hash
            {"actor": "a\x7f"},
            {"at": -0.0},
            {"at": 0.0},
            {"at": 0.1},
            {"at": 0.1 + 2**-56},
            {"data": None},
            {"run_id": None},
        )
    }
    assert len(distinct) == 10


async def test_each_record_is_checked_in_the_encoding_it_names(store: Store) -> None:
    """On both backends: a chain rewritten exactly as the old code sealed it (old
    encoding, ``hash_v`` NULL) verifies; the same hashes claiming canonical JSON do
    not, and an edit of an old-encoding record is found."""
    for user in ("josé", "bob"):
        await service_app.app.submit(store, "echo", {"text": "é"}, tenant_id="acmé", user_id=user)
    await sealer.seal_once(store)

    def chain(tx: Tx) -> list[dict[str, Any]]:
        return tx.fetchall(
            "SELECT * FROM events WHERE tenant_id = 'acmé' ORDER BY chain_no"
        )  # fmt: skip

    def as_old_code(tx: Tx) -> None:
        prev = GENESIS
        for row in chain(tx):
            digest = record_hash(prev, "acmé", row, row["chain_no"], version=None)
            tx.execute(
                "UPDATE events SET hash = :h, prev_hash = :p, hash_v = NULL "
                      "WHERE id = :i", {"h": digest, "p": prev, "i": row["id"]})  # fmt: skip
            prev = digest
        tx.execute("UPDATE audit_heads SET hash = :h WHERE tenant_id = 'acmé'", {"h": prev})

    async def verify() -> list[Any]:
        _, broken = await store.read(service_audit.verify_chain)
        return list(broken)

    assert [r["hash_v"] for r in await store.read(chain)] == [2, 2]
    assert await verify() == []
    await store.transact(as_old_code)
    assert await verify() == []
    await store.transact(lambda tx: tx.execute("UPDATE events SET hash_v = 2"))
    broken = await verify()
    assert broken and "does not match its hash" in broken[0].reason
    await store.transact(lambda tx: tx.execute("UPDATE events SET hash_v = NULL"))
    assert await verify() == []
    await store.transact(lambda tx: tx.execute("UPDATE events SET actor = 'mallory' WHERE seq = 1"))
    assert await verify()
