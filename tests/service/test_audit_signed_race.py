"""Signing sealers in several processes at once, on both backends: two processes append
and seal (signed) one tenant's records concurrently, and `audit sign-unsigned` adopts an
unsigned history while a keyed sealer keeps trying to extend it. The chain ends with no
fork, no gap and every record signed under the key."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from agentledger import _auditkey as auditkey
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from tests.service.test_audit_signed import ENV, KEY, _chain, _runs, _sealed, keyed, run_cli

__all__ = ["keyed"]  # the fixture, used by name

SEALER = textwrap.dedent(
    """
    import asyncio, sys
    from agentledger.store import open_store
    from agentledger.service._queries import audit as service_audit
    from agentledger.store._queries.events import insert_event

    async def main(url, run_id, rounds):
        store = open_store(url)
        await store.open()
        sealed = 0
        for i in range(rounds):
            await store.transact(insert_event, run_id, "tool.called", "w", {"i": i})
            try:
                sealed += await store.transact(service_audit.seal)
            except Exception as exc:  # another sealer chained some first: retried next round
                assert "sealed concurrently" in str(exc) or "could not" in str(exc), exc
        await store.close()
        print(sealed)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


def _sealer(url: str, run_id: str, rounds: int) -> subprocess.Popen[str]:
    env = {**os.environ, ENV: KEY}
    return subprocess.Popen(
        [sys.executable, "-c", SEALER, url, run_id, str(rounds)], env=env, text=True,
        stdout=subprocess.PIPE,
    )  # fmt: skip


async def _verified(store: Store, tenant: str) -> list[dict[str, object]]:
    key = auditkey.key_from_text(KEY)
    checked, broken = await store.read(service_audit.verify_chain, tenant, key)
    assert broken == [], broken
    chain = await _chain(store, tenant)
    assert checked == len(chain) and all(r["sig"] for r in chain)
    return chain


async def test_two_signing_sealers_at_once(keyed: None, store: Store, store_url: str) -> None:
    a, b = await _runs(store, "t1", 2)
    await _sealed(store)
    procs = [_sealer(store_url, a, 60), _sealer(store_url, b, 60)]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
    await _sealed(store)
    chain = await _verified(store, "t1")
    assert len(chain) == 2 + 120


async def test_sign_unsigned_while_a_keyed_sealer_runs(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    (run_id,) = await _runs(store, "t1", 1)
    await _sealed(store)  # no key: an unsigned history
    sealing = _sealer(store_url, run_id, 40)  # keyed: refused until the history is adopted
    adopted = await run_cli("sign-unsigned", "--db", store_url)
    out, _ = sealing.communicate(timeout=300)
    assert sealing.returncode == 0, out
    # Refused while the sealer held the head (PostgreSQL) is the one allowed failure.
    if adopted.exit_code != 0:
        assert "being sealed" in str(adopted.exception), adopted.output
        adopted = await run_cli("sign-unsigned", "--db", store_url)
    assert adopted.exit_code == 0 and "tenant t1: signed" in adopted.output, adopted.output
    monkeypatch.setenv(ENV, KEY)
    await _sealed(store)
    chain = await _verified(store, "t1")
    assert len(chain) == 1 + 40  # run.submitted, then the sealer process's records
