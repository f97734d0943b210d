"""The LISTEN connection that brings other processes' model deltas to a service process
(service/_deltas.py) lives only while a stream follows a run, and never outlives the
service: the last stream leaving closes it, and shutdown closes one whose stream was
abandoned without its generator being closed."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import psycopg

from agentledger.service import _deltas as deltas

APP_NAME = "agentledger-delta-listener"


def listeners(url: str) -> int:
    """Backends of this database connected by a delta bridge, as the server sees them."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND datname = current_database()",
            (APP_NAME,),
        ).fetchone()
    return int(row[0]) if row else 0


def listener_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "agentledger-listener")


async def settled(url: str, want: int, timeout: float = 15.0) -> int:
    """Poll until the database shows ``want`` bridge connections; return the last count."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        seen = await asyncio.to_thread(listeners, url)
        if seen == want or asyncio.get_running_loop().time() > deadline:
            return seen
        await asyncio.sleep(0.05)


async def test_the_last_stream_leaving_closes_the_bridge(pg_url: str) -> None:
    threads = listener_threads()
    async with deltas._bridged(pg_url), deltas._bridged(pg_url):
        assert await settled(pg_url, 1) == 1  # two streams share one connection
    assert await settled(pg_url, 0) == 0
    for _ in range(200):  # the thread sees its stop flag within its poll interval
        if listener_threads() == threads:
            break
        await asyncio.sleep(0.05)
    assert listener_threads() == threads


async def test_shutdown_closes_a_bridge_whose_stream_was_abandoned(pg_url: str) -> None:
    threads = listener_threads()
    abandoned = deltas._bridged(pg_url)
    await abandoned.__aenter__()  # a stream whose generator is never closed
    try:
        assert await settled(pg_url, 1) == 1
        await deltas.close_bridges()  # what the app's shutdown does
        # The client has closed it; the server's backend leaves pg_stat_activity when
        # it has read the goodbye, a moment later on a busy machine.
        assert await settled(pg_url, 0) == 0
        assert listener_threads() == threads
    finally:
        with contextlib.suppress(Exception):
            await abandoned.__aexit__(None, None, None)
