"""Attacks on the audit chain seam (agentledger/_auditchain.py) where the kernel drives
it on a schedule: a worker's ``--prune-every`` loop in a process without the chain."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentledger.store import Store
from agentledger.store._queries.retention import Policy, set_policy

ROOT = Path(__file__).resolve().parents[2]

PRUNE_LOOP = """
import asyncio, sys
from agentledger import _prune, open_store

async def main(url):
    store = open_store(url)
    await store.open()
    try:
        await asyncio.wait_for(_prune.prune_forever(store, 0.05), 5.0)
    finally:
        await store.close()

try:
    asyncio.run(main(sys.argv[1]))
    print("returned")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


async def _claimed_until(store: Store) -> float:
    rows = await store.read(
        lambda tx: tx.fetchall("SELECT claimed_until FROM prune_rounds WHERE id = 1")
    )
    return float(rows[0]["claimed_until"]) if rows else 0.0


async def test_the_prune_schedule_refuses_without_the_chain_and_claims_no_round(
    store: Store,
) -> None:
    """Without the chain the schedule must stop at once, loud, naming the import -- not
    claim every round (so that workers that have the chain skip it) and log a warning
    per tenant forever."""
    await store.transact(set_policy, Policy("default", 0.0))
    before = await _claimed_until(store)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", PRUNE_LOOP, store.url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )
    out = done.stdout.strip()
    assert out.startswith("MissingFeature"), (out, done.stderr[-2000:])
    assert "import agentledger.service" in out and "\n" not in out, out
    assert await _claimed_until(store) == before  # no round taken from the others
