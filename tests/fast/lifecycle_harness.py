"""In-process harness for the run lifecycle: a real SQLite store in a temp dir, a
FakeClock, and explicit passes of :func:`execute_run` (one claim each).

Every claim takes a lease that is already expired, so the next pass may take the
run over exactly as a worker does after the previous owner died; a pass that is
"killed" (a tool raises :class:`Killed`) leaves the journal as a SIGKILL would.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from agentledger import App, open_store
from agentledger._clock import FakeClock
from agentledger.engine._runner import execute_run
from agentledger.records import Event, Run, Step
from agentledger.store._base import Batch
from agentledger.store._sqlstore import Store
from tests.sqlite_template import migrated_copy

KILLED = "killed"


class Killed(BaseException):
    """The worker process died here (nothing below the test catches it)."""


class Harness:
    """One test's store, app and clock, and helpers to run passes of a run."""

    def __init__(self, tmp_path: Path, app: App, url: str | None = None) -> None:
        """``url``: another store (a PostgreSQL database) instead of the SQLite file."""
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.path = tmp_path / "lifecycle.db"
        self.app = app
        if url is not None and url.startswith("sqlite:///"):
            self.path = Path(url.removeprefix("sqlite:///"))
        if url is None and not self.path.exists():
            # A copy of the migrated file: the database as a first open leaves it, without
            # a migration per harness. A harness opened again on the same folder (a
            # restart) keeps the file it finds.
            migrated_copy(self.path)
        self.url = url or f"sqlite:///{self.path}"
        self.store: Store = open_store(self.url)
        # Far enough in the past that anything parked on it is due by the DB's clock.
        self.clock = FakeClock(start=time.time() - 30 * 86400)
        self.cancels: dict[str, str] = {}
        self.batches: list[Batch] = []
        self.passes = 0
        original = self.store.commit

        async def spy(batch: Batch) -> None:
            await original(batch)
            self.batches.append(batch)

        self.store.commit = spy  # type: ignore[method-assign]

    async def __aenter__(self) -> Harness:
        await self.store.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.close()

    async def submit(self, name: str, input: Any = None) -> str:
        return await self.app.submit(self.store, name, input if input is not None else {})

    async def claim(self, run_id: str, owner: str) -> Run:
        run = await self.store.get_run(run_id)
        assert run is not None
        self.wake(run_id)
        claimed = await self.store.claim_runs(owner, [run.target], 10, -1.0)
        for candidate in claimed:
            if candidate.id == run_id:
                return candidate
        raise AssertionError(f"run {run_id} was not claimable: {run}")

    def wake(self, run_id: str) -> None:
        """Time passed: a parked run is due now (the DB judges by its own clock)."""
        if not self.url.startswith("sqlite"):
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as pg:
                pg.execute(
                    "UPDATE runs SET available_at = 0 WHERE id = %s "
                    "AND status IN ('waiting','queued')",
                    (run_id,),
                )
            return
        with sqlite3.connect(self.path) as conn:
            conn.execute(
                "UPDATE runs SET available_at = 0 WHERE id = ? AND status IN ('waiting','queued')",
                (run_id,),
            )

    async def execute(
        self, run_id: str, *, owner: str | None = None, cancel_requested: str | None = None
    ) -> str:
        """One pass: claim the run and execute it until it rests (or is killed)."""
        self.passes += 1
        owner = owner or f"w{self.passes}"
        run = await self.claim(run_id, owner)
        if cancel_requested is not None:
            run.cancel_requested = cancel_requested
        try:
            return await execute_run(
                self.store, self.app, run, owner, clock=self.clock, cancel_requests=self.cancels
            )
        except Killed:
            return KILLED

    async def drive(self, run_id: str, passes: int = 30) -> Run:
        """Pass after pass until the run is terminal; a parked run's time is made to pass."""
        for _ in range(passes):
            await self.execute(run_id)
            run = await self.run(run_id)
            if run.terminal:
                return run
            if run.available_at is not None:
                self.clock.advance(max(0.0, run.available_at - self.clock.now()) + 1.0)
        raise AssertionError(f"run {run_id} did not finish: {await self.run(run_id)}")

    async def run(self, run_id: str) -> Run:
        run = await self.store.get_run(run_id)
        assert run is not None
        return run

    async def journal(self, run_id: str) -> list[Step]:
        return await self.store.load_journal(run_id)

    async def events(self, run_id: str) -> list[Event]:
        return await self.store.list_events(run_id)

    def set_key(self, run_id: str, step_no: int, key: str) -> None:
        """Rewrite a journaled idempotency key (a run journaled by older code)."""
        with sqlite3.connect(self.path) as conn:
            conn.execute(
                "UPDATE steps SET idempotency_key = ? WHERE run_id = ? AND step_no = ?",
                (key, run_id, step_no),
            )
