"""A real StayHub stack per test: the sandbox subprocess, worker subprocesses on a SQLite
file, an opened store in the test process and the scripted guest approving bookings."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentledger.records import Event, Run, Step
from agentledger.store import Store, open_store
from agentledger_examples.stayhub.app import app
from agentledger_examples.stayhub.harness import (
    AGENT,
    WorkerPool,
    approve_as_guests,
    wait_outbox_drained,
    wait_terminal,
)
from agentledger_examples.stayhub.sandbox import SandboxServer, check_invariants
from tests.conftest import migrated_sqlite

INPUT = {
    "guest_id": "g-123",
    "city": "Lisbon",
    "check_in": "2026-12-20",
    "nights": 2,
    "script": "normal",
}


@dataclass
class Stack:
    sandbox: SandboxServer
    pool: WorkerPool
    store: Store
    log_dir: Path
    db: str

    async def submit(self, **overrides: Any) -> str:
        return await app.submit(self.store, AGENT, {**INPUT, **overrides})

    async def wait(self, run_id: str, timeout: float = 40.0) -> Run:
        states = await wait_terminal(self.store, [run_id], timeout, poll=0.05)
        run = await self.store.get_run(run_id)
        assert run is not None
        assert run.terminal, f"run {run_id} is {states[run_id]} after {timeout}s{self.logs()}"
        return run

    async def journal(self, run_id: str) -> list[Step]:
        return await self.store.load_journal(run_id)

    async def events(self, run_id: str) -> list[Event]:
        return await self.store.list_events(run_id)

    async def drain(self, timeout: float = 30.0) -> dict[str, int]:
        return dict(await wait_outbox_drained(self.store, timeout))

    def ledger(self, run_id: str | None = None) -> list[dict[str, Any]]:
        effects = self.sandbox.ledger()
        if run_id is None:
            return effects
        return [e for e in effects if str(e.get("idempotency_key", "")).startswith(run_id)]

    def invariants(self) -> dict[str, Any]:
        return check_invariants(self.sandbox.ledger())

    def logs(self) -> str:
        return "".join(
            f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )


StackFactory = Callable[..., contextlib.AbstractAsyncContextManager[Stack]]


@pytest.fixture
def stayhub(tmp_path: Path, sqlite_template: Path) -> StackFactory:
    """``async with stayhub(faults=..., env=..., workers=2) as stack: ...``

    ``guest_approver=False`` leaves every approval to the test (the scripted guest
    approves whatever is pending, whatever its role).
    """

    @contextlib.asynccontextmanager
    async def make(
        faults: str | None = None,
        env: dict[str, str] | None = None,
        workers: int = 2,
        guest_approver: bool = True,
    ) -> AsyncIterator[Stack]:
        db = migrated_sqlite(sqlite_template, tmp_path / "agentledger.db")
        store = open_store(db)
        await store.open()
        stop = asyncio.Event()
        sandbox = SandboxServer(faults=faults)

        def pool_for(url: str) -> WorkerPool:
            return WorkerPool(db, url, size=workers, env=dict(env or {}), log_dir=tmp_path)

        # The workers start while the sandbox does (each takes a process start): they only
        # call it for a run, and no run is submitted before it answers.
        pool = pool_for(sandbox.url).start()
        try:
            sandbox.start()
            if pool.stayhub_url != sandbox.url:  # its port was taken: it listens on another
                pool.stop()
                pool = pool_for(sandbox.url).start()
            approver = asyncio.create_task(
                approve_as_guests(store, stop, poll=0.02) if guest_approver else stop.wait()
            )
            try:
                yield Stack(sandbox, pool, store, tmp_path, db)
            finally:
                stop.set()
                await approver
        finally:
            pool.stop()
            sandbox.stop()
            await store.close()

    return make
