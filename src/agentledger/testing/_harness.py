"""An App run in process: a private SQLite file, the real engine and an in-process
worker, driven from a test."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

# A harness worker is a production worker: priced model calls are checked against
# tenant budgets and its records are sealed, by the features that do it in production
# (registered with the kernel when imported: engine/_hooks.py, agentledger/_auditchain.py).
import agentledger.gateway as _gateway  # noqa: F401
import agentledger.service as _service  # noqa: F401
from agentledger._app import App
from agentledger._clock import SYSTEM
from agentledger.records import Approval, ApprovalDecision, Run, Step
from agentledger.store import open_store
from agentledger.worker import Companion, Worker, WorkerConfig


class Harness:
    """Run ``app`` in process against its own store.

    ``db``: a store URL; by default a SQLite file in a temporary directory removed on
    exit. Use as ``async with Harness(app) as h:``; then :meth:`submit` runs,
    :meth:`run_until_settled` executes them with a real worker (leases, journal, status
    checks and retries as in production), and :meth:`journal`, :meth:`approve`,
    :meth:`reject` read and decide.
    """

    def __init__(
        self,
        app: App,
        *,
        db: str | None = None,
        config: WorkerConfig | None = None,
        companions: Sequence[Companion] = (),
    ) -> None:
        self.app = app
        # Features' side tasks for the worker (worker/_companions.py), none by default.
        self.companions = tuple(companions)
        self._url = db
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.config = config or WorkerConfig(poll_seconds=0.02, shutdown_grace=2.0)
        self._store: Any = None

    @property
    def store(self) -> Any:
        """The open store (for reads the harness does not wrap)."""
        if self._store is None:
            raise RuntimeError("the harness is not open: use `async with Harness(app) as h`")
        return self._store

    async def __aenter__(self) -> Harness:
        if self._url is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="agentledger-test-")
            self._url = f"sqlite:///{Path(self._tmp.name) / 'runs.db'}"
        store = open_store(self._url)
        await store.open()
        self._store = store
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._store is not None:
                await self._store.close()
        finally:
            self._store = None
            if self._tmp is not None:
                self._tmp.cleanup()

    async def submit(
        self,
        name: str,
        input: Any = None,
        *,
        version: str | None = None,
        tenant_id: str = "default",
        user_id: str | None = None,
    ) -> str:
        """Queue a run of the agent or workflow ``name``; returns its id."""
        return await self.app.submit(
            self.store, name, input, version=version, tenant_id=tenant_id, user_id=user_id
        )

    async def run_until_settled(self, run_id: str | None = None, timeout: float = 30.0) -> Run:
        """Let a worker execute until nothing is runnable (retries and backoffs waited
        out), then return ``run_id``'s run (default: the latest submitted). Raises
        ``TimeoutError`` if the runs have not settled within ``timeout`` seconds."""
        worker = Worker(self.store, self.app, self.config, burst=True, companions=self.companions)
        await asyncio.wait_for(worker.run(install_signals=False), timeout)
        if run_id is None:
            runs = await self.store.list_runs(limit=1)
            if not runs:
                raise ValueError("no run was submitted")
            run_id = runs[0].id
        return await self.run(run_id)

    async def run(self, run_id: str) -> Run:
        """The run as stored now."""
        run = await self.store.get_run(run_id)
        if run is None:
            raise KeyError(f"no run {run_id!r}")
        return run

    async def journal(self, run_id: str) -> list[Step]:
        """The run's journal: every step, in order."""
        steps: list[Step] = await self.store.load_journal(run_id)
        return steps

    async def approvals(self, run_id: str | None = None, pending: bool = True) -> list[Approval]:
        """Approvals (of one run, or of all), by default only the undecided ones."""
        found: list[Approval] = await self.store.get_approvals(run_id, pending)
        return found

    async def approve(self, approval_id: str, by: str) -> Approval:
        """Approve as ``by`` (a role or a person); the run is queued again."""
        return await self._decide(approval_id, ApprovalDecision.APPROVE, by)

    async def reject(self, approval_id: str, by: str) -> Approval:
        """Reject as ``by``; the run goes on with the rejection."""
        return await self._decide(approval_id, ApprovalDecision.REJECT, by)

    async def _decide(self, approval_id: str, decision: ApprovalDecision, by: str) -> Approval:
        decided: Approval = await self.store.decide_approval(approval_id, decision, by, SYSTEM)
        return decided
