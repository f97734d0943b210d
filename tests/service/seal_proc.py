"""A sealer process for the concurrent-sealing test: seals in small batches until told to
stop and no event is left unsealed; prints how many records it sealed. Any error exits
non-zero."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store


async def main(url: str, ready: Path, stop: Path) -> None:
    store = open_store(url)
    await store.open()
    total = 0
    try:
        ready.touch()
        while True:
            # Read the flag first: a seal that finds nothing after it was set saw every
            # event committed before it.
            stopping = stop.exists()
            sealed = await store.transact(service_audit.seal, 7)
            total += sealed
            if sealed:
                ready.with_suffix(".sealed").touch()  # the test waits until both have
            # Nothing sealed is not nothing left: on PostgreSQL the other sealer may hold
            # the heads of the oldest events (SKIP LOCKED), and stop at the same moment.
            if stopping and sealed == 0:
                left, _ = await store.read(service_audit.unsealed_tail)
                if left == 0:
                    break
    finally:
        await store.close()
    print(total)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
