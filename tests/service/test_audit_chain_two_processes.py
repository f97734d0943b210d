"""Accept groups chained at insert (SQLite) while another process on the same file
appends worker events and seals them: the chain has no fork and no gap."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from tests.service.test_accept_group_fast import ok, request, submit

SEALER = textwrap.dedent(
    """
    import asyncio, sys
    from agentledger.store import open_store
    from agentledger.service._queries import audit as service_audit
    from agentledger.store._queries.events import insert_event

    async def main(url, run_id, rounds):
        store = open_store(url)
        await store.open()
        for i in range(rounds):
            await store.transact(insert_event, run_id, "tool.called", "w\\u00e9", {"i": i})
            await store.transact(service_audit.seal)
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


async def test_groups_and_a_sealing_process_on_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chain.db'}"
    store = open_store(url)
    await store.open()
    try:
        first, _ = await submit(store, [request(0, tag="seed")])
        run_id = ok(first[0]).run.id
        other = subprocess.Popen([sys.executable, "-c", SEALER, url, run_id, "200"])
        try:
            for g in range(60):
                await submit(store, [request(i, tag=f"g{g}", tenant=f"t{i % 2 + 1}")
                                     for i in range(1, 6)])  # fmt: skip
        finally:
            assert other.wait(timeout=120) == 0
        await store.transact(service_audit.seal)
        checked, broken = await store.read(service_audit.verify_chain)
        assert broken == []
        events = await store.read(lambda tx: tx.fetchall("SELECT COUNT(*) AS n FROM events"))
        assert checked == events[0]["n"] == 2 + 60 * 5 * 2 + 200
    finally:
        await store.close()
