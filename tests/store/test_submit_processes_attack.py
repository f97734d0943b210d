"""Submitter processes racing on one database (both stores): several submit the same
request ids at once (hostile tenant ids among them), a sealer process seals as they go
and this process claims the runs as they appear. Each request id makes one run with one
``run.submitted`` event at seq 1, every run's events have no gap in seq, and the audit
chain verifies."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from tests.store.test_claim_statements import _events
from tests.store.test_contract import TARGET

RUNS = 40
SUBMITTER = textwrap.dedent(
    f"""
    import asyncio, sys
    from agentledger.store import open_store
    from agentledger.store._base import NewRun

    TENANTS = ["t'1", 't"2', "t\\\\3", "t,{{4}}", "NULL", "té"]

    async def main(url, me):
        store = open_store(url)
        await store.open()
        try:
            for i in range({RUNS}):
                rid = f"shared-{{i}}" if i % 2 else f"own-{{me}}-{{i}}"
                new = NewRun(kind="agent", name="agent", version="1", input={{"i": i}},
                             tenant_id=TENANTS[i % len(TENANTS)], request_id=rid)
                await store.create_run(new)
        finally:
            await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)
SEALER = textwrap.dedent(
    """
    import asyncio, sys, pathlib
    from agentledger.store import open_store
    from agentledger.service._queries import audit as service_audit

    async def main(url, stop):
        store = open_store(url)
        await store.open()
        try:
            while not pathlib.Path(stop).exists():
                await store.transact(service_audit.seal, 7)
        finally:
            await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_racing_submitters_a_sealer_and_a_claimer(store_url: str, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    store = open_store(store_url)
    await store.open()
    sealer = subprocess.Popen([sys.executable, "-c", SEALER, store_url, str(stop)])
    procs = [
        subprocess.Popen([sys.executable, "-c", SUBMITTER, store_url, str(n)]) for n in range(3)
    ]
    try:
        claimed: list[str] = []
        while any(p.poll() is None for p in procs):
            claimed += [r.id for r in await store.claim_runs("w1", [TARGET], 50, 300)]
        assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
        claimed += [r.id for r in await store.claim_runs("w1", [TARGET], 500, 300)]
    finally:
        for p in procs:  # a failed submitter leaves none behind retrying its database
            if p.poll() is None:
                p.kill()
                p.wait()
        stop.touch()
        assert sealer.wait(timeout=120) == 0
    try:
        runs = await store.list_runs(limit=1000)
        assert len(runs) == RUNS // 2 + 3 * RUNS // 2
        assert sorted(claimed) == sorted(r.id for r in runs)
        for run in runs:
            assert [e[:2] for e in await store.read(_events, run.id)] == [
                (1, "run.submitted"),
                (2, "run.claimed"),
            ], run
        await store.transact(service_audit.seal)
        checked, broken = await store.read(service_audit.verify_chain)
        assert broken == []
        assert checked == 2 * len(runs)
    finally:
        await store.close()
