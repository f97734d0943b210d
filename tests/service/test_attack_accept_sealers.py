"""Two services on one database, each sealing every 10 ms (signed), plus a sealer
process, while submits race over both (the same Idempotency-Keys across the two, two
tenants): every tenant's chain ends with no fork and no gap, every record signed, and
each key made one run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentledger import _auditkey as auditkey
from agentledger.service._queries import audit as service_audit
from tests.service.conftest import in_process, settings_for
from tests.service.test_audit_signed import ENV, KEY

SEAL_PROC = Path(__file__).with_name("seal_proc.py")
ROOT = Path(__file__).resolve().parents[2]


async def test_two_services_and_a_sealer_race_accepts_into_one_chain(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, KEY)
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    env = {**os.environ, ENV: KEY, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    settings = settings_for(store_url, audit_seal_every=0.01)
    async with in_process(settings) as a, in_process(settings) as b:
        heads = {t: await a.key(tenant=t) for t in ("t1", "t2")}
        proc = subprocess.Popen(
            [sys.executable, str(SEAL_PROC), store_url, str(ready), str(stop)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            rounds, per_round = 6, 16
            answered: dict[str, set[str]] = {}
            for n in range(rounds):
                posts = []
                for i in range(per_round):
                    tenant = "t1" if i % 4 else "t2"
                    h = {**heads[tenant], "Idempotency-Key": f"k{n}-{i % 8}"}
                    body = {"agent": "free", "input": {"n": n, "i": i % 8}}
                    api = a if i % 2 else b
                    posts.append(api.client.post("/v1/runs", json=body, headers=h))
                replies = await asyncio.gather(*posts)
                assert {r.status_code for r in replies} <= {202, 409}, [r.text for r in replies]
                for i, r in enumerate(replies):
                    if r.status_code == 202:
                        answered.setdefault(f"k{n}-{i % 8}", set()).add(r.json()["id"])
            stop.touch()
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        await a.store.transact(service_audit.seal)
        key = auditkey.key_from_text(KEY)
        checked, broken = await a.store.read(lambda tx: service_audit.verify_chain(tx, None, key))
        assert broken == [], broken
        rows = await a.store.read(
            lambda tx: tx.fetchall(
                "SELECT tenant_id, chain_no, sig, hash FROM events ORDER BY tenant_id, chain_no"
            )
        )
        assert checked == len(rows)
        for tenant in ("t1", "t2"):
            chain = [r for r in rows if r["tenant_id"] == tenant]
            assert [r["chain_no"] for r in chain] == list(range(1, len(chain) + 1))
            assert all(r["sig"] for r in chain)
        keys = await a.store.read(
            lambda tx: tx.fetchall("SELECT COUNT(*) AS n FROM idempotency_keys")
        )
        runs = await a.store.read(lambda tx: tx.fetchall("SELECT COUNT(*) AS n FROM runs"))
        assert keys[0]["n"] == runs[0]["n"] == rounds * 8
        assert all(len(ids) == 1 for ids in answered.values()), answered


async def test_quota_edge_with_keys_repeated_across_two_services(store_url: str) -> None:
    """Five runs in flight allowed; twelve submits of six keys, each key sent once to each
    service at the same moment: exactly five runs, each key answered by one run (or
    refused by the quota), a replay never refused by it."""
    settings = settings_for(store_url, max_in_flight=5)
    async with in_process(settings) as a, in_process(settings) as b:
        h = await a.key(tenant="tq")
        posts = []
        for i in range(12):
            headers = {**h, "Idempotency-Key": f"q-{i // 2}"}
            body = {"agent": "free", "input": {"k": i // 2}}
            posts.append((a if i % 2 else b).client.post("/v1/runs", json=body, headers=headers))
        replies = await asyncio.gather(*posts)
        by_key: dict[int, set[object]] = {}
        for i, r in enumerate(replies):
            assert r.status_code in (202, 409, 429), r.text
            by_key.setdefault(i // 2, set()).add(r.json()["id"] if r.status_code == 202 else None)
        accepted = {k for k, ids in by_key.items() if ids - {None}}
        assert len(accepted) == 5, by_key
        assert all(len(ids - {None}) <= 1 for ids in by_key.values()), by_key
        # The accepted keys replay even with the quota spent; a new key is refused.
        for k in accepted:
            again = await a.client.post(
                "/v1/runs", json={"agent": "free", "input": {"k": k}},
                headers={**h, "Idempotency-Key": f"q-{k}"},
            )  # fmt: skip
            assert again.status_code == 202 and again.json()["id"] in by_key[k]
        runs = await a.store.read(lambda tx: tx.fetchall("SELECT COUNT(*) AS n FROM runs"))
        assert runs[0]["n"] == 5
