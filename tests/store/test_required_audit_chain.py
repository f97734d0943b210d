"""The audit chain is ``agentledger.service``'s, reached by the kernel through a seam it
registers when imported (agentledger/_auditchain.py). A process that never imported it
refuses, before it reads or removes anything: a seal (the records stay unsealed for a
process that has the chain, never chained wrongly), a prune (nothing removed that the
chain's summary would have to account for) and a worker (nothing claimed whose records
nobody would seal). With the chain, the same store seals and prunes as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentledger import _prune as pruning
from agentledger import _sealer as sealer
from agentledger.records import RunStatus
from agentledger.store import Store
from agentledger.store._queries.retention import Policy
from tests.service import service_app
from tests.store.test_prune import _count, _finished

ROOT = Path(__file__).resolve().parents[2]

# A process with the kernel only: the actions given, one after the other (one line each),
# then which feature packages loaded.
KERNEL_ONLY = """
import asyncio, sys
from agentledger import App, Worker, WorkerConfig, open_store
from agentledger import _prune, _sealer
from agentledger.store._queries.retention import Policy

app = App("x")

@app.workflow()
async def echo(ctx, inp):  # the queued run's workflow: a worker that started would run it
    return inp

async def main(url, action):
    store = open_store(url)
    await store.open()
    try:
        if action == "seal":
            await _sealer.seal_once(store)
        elif action == "seal-quietly":
            await _sealer.seal_quietly(store)
        elif action == "prune":
            await _prune.prune_tenant(store, Policy("default", 0.0))
        elif action == "worker":
            await Worker(store, app, WorkerConfig(poll_seconds=0.02), burst=True).run(
                install_signals=False
            )
    finally:
        await store.close()

for action in sys.argv[2:]:  # each on a store of its own, one line each
    try:
        asyncio.run(main(sys.argv[1], action))
        print("proceeded")
    except Exception as exc:
        print(type(exc).__name__, str(exc).splitlines()[0])
print("features:", sorted({m.split(".")[1] for m in sys.modules
      if m.startswith("agentledger.") and m.split(".")[1] in ("service", "gateway")}))
"""


def _kernel_only(url: str, *actions: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", KERNEL_ONLY, url, *actions],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == len(actions) + 1, (done.stdout, done.stderr)
    assert lines[-1] == "features: []", (done.stdout, done.stderr)
    return lines[:-1]


UNSEALED = "SELECT COUNT(*) AS n FROM events WHERE hash IS NULL"
EVENTS = "SELECT COUNT(*) AS n FROM events"


async def test_seal_prune_and_worker_refuse_without_the_chain(store: Store) -> None:
    url = str(store.url)
    [done_id] = await _finished(store, "default", 1)  # completed, its records sealed
    assert await _count(store, UNSEALED) == 0
    queued = await service_app.app.submit(store, "echo", {"text": "q", "steps": 1})
    unsealed = await _count(store, UNSEALED)
    events = await _count(store, EVENTS)
    assert unsealed > 0

    # One process tries them all: each is refused at once, and nothing any of them could
    # have done is undone by another (a seal, a removal, a claim's epoch), so what the
    # store holds after the last says none happened.
    actions = ("seal", "seal-quietly", "prune", "worker")
    for action, first in zip(actions, _kernel_only(url, *actions), strict=True):
        assert first.startswith("MissingFeature "), (action, first)
        assert "import agentledger.service" in first, first
    # Nothing happened: no record sealed, none removed, the run not claimed.
    assert await _count(store, UNSEALED) == unsealed
    assert await _count(store, EVENTS) == events
    run = await store.get_run(queued)
    assert run is not None and run.status == RunStatus.QUEUED and run.lease_epoch == 0

    # With the chain (this process imported agentledger.service): sealed and pruned.
    assert await sealer.seal_once(store) == unsealed
    removed = await pruning.prune_tenant(store, Policy("default", 0.0))
    assert removed.runs == 1 and removed.records > 0 and not removed.stopped
    assert await store.get_run(done_id) is None
