"""The worker process: claim, lease, heartbeat, execute, shut down cleanly.

Side tasks (claim loop, heartbeat, outbox dispatcher) are supervised: if one
dies, the worker stops instead of limping on with leases it cannot renew.

SIGTERM/SIGINT: stop claiming; each run stops at its next step boundary and is
released (queued again, lease cleared); runs still inside a step after the grace
period are cancelled and released -- a write left ``started`` is resolved by the
next owner through the unknown-outcome path. Exit code 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentledger.app import App
from agentledger.engine.runner import RELEASED, execute_run
from agentledger.records import Run, WorkerInfo
from agentledger.store.base import Store
from agentledger.worker.liveness import is_dead_local_owner, make_owner_id

log = logging.getLogger(__name__)


@dataclass
class WorkerConfig:
    """Tuning of one worker process (defaults documented in the README)."""

    concurrency: int = 50
    lease_seconds: float = 15.0
    heartbeat_seconds: float | None = None  # default: a third of the lease
    poll_seconds: float = 0.2
    reap_seconds: float = 0.5
    reap_dead_local_owners: bool = True  # off: behave like a worker on another host
    shutdown_grace: float = 10.0
    park_threshold: float = 2.0
    max_resumes: int = 50  # lease takeovers before a run is handed to a human
    outbox: bool = True


class Worker:
    """Runs many runs concurrently on one asyncio loop."""

    def __init__(self, store: Store, app: App, config: WorkerConfig | None = None) -> None:
        self.store = store
        self.app = app
        self.config = config or WorkerConfig()
        self.owner = make_owner_id()
        self.stopping = asyncio.Event()
        self.active: dict[str, tuple[asyncio.Task[str], int]] = {}
        self._wake = asyncio.Event()
        self.on_finished: Callable[[str, str], None] | None = None

    @property
    def targets(self) -> list[str]:
        return sorted(self.app.targets())

    def wake(self) -> None:
        """Claim now instead of at the next poll (e.g. on a NOTIFY)."""
        self._wake.set()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    async def run(self, install_signals: bool = True) -> None:
        """Work until stopped (SIGTERM/SIGINT or :meth:`stop`)."""
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        await self.app.startup()
        info = WorkerInfo(
            id=self.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            targets=self.targets,
            started_at=time.time(),
            heartbeat_at=time.time(),
        )
        await self.store.register_worker(info, self.app.targets())
        side = [
            asyncio.create_task(self._claim_loop(), name="claim"),
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
        ]
        if self.config.outbox:
            from agentledger.outbox import OutboxDispatcher

            # An outbox claim is a lease too: a SIGKILLed worker's claims must expire about
            # as fast as its run leases, yet outlast one delivery (bounded by the tool timeout).
            timeouts = [t.timeout for t in self.app.tools.values() if t.delivery == "outbox"]
            outbox_lease = max([self.config.lease_seconds, *(2 * t + 1 for t in timeouts)])
            dispatcher = OutboxDispatcher(
                self.store, self.app, owner=self.owner, lease_seconds=outbox_lease
            )
            side.append(asyncio.create_task(dispatcher.run(self.stopping), name="outbox"))
        # PostgreSQL wakes us on NOTIFY; polling stays as the fallback.
        listen = getattr(self.store, "listen", None)
        stop_listening = listen(lambda: loop.call_soon_threadsafe(self.wake)) if listen else None
        stopper = asyncio.create_task(self.stopping.wait())
        try:
            done, _ = await asyncio.wait([*side, stopper], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and task.exception() is not None:
                    log.error(
                        "worker side task %s died: %r; stopping", task.get_name(), task.exception()
                    )
                    self.stop()
            self.stop()
            await self._drain()
        finally:
            for task in [*side, stopper]:
                task.cancel()
            await asyncio.gather(*side, stopper, return_exceptions=True)
            if stop_listening is not None:
                await asyncio.to_thread(stop_listening)
            with contextlib.suppress(Exception):
                await self.store.deregister_worker(self.owner)
            await self.app.shutdown()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _drain(self) -> None:
        tasks = [task for task, _ in self.active.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.config.shutdown_grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for run_id, (_, epoch) in list(self.active.items()):
            with contextlib.suppress(Exception):
                await self.store.release_run(run_id, epoch, self.owner)

    # claiming -------------------------------------------------------------

    async def _claim_loop(self) -> None:
        last_reap = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            if self.config.reap_dead_local_owners and now - last_reap >= self.config.reap_seconds:
                last_reap = now
                await self._reap_dead_local_owners()
            free = self.config.concurrency - len(self.active)
            if free > 0:
                runs = await self.store.claim_runs(
                    self.owner, self.targets, free, self.config.lease_seconds
                )
                for run in runs:
                    self._start(run)
                if runs and len(runs) == free:
                    continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.poll_seconds)

    async def _reap_dead_local_owners(self) -> None:
        dead = [o for o in await self.store.lease_owners() if is_dead_local_owner(o)]
        if dead:
            expired = await self.store.expire_leases_of(dead)
            log.info("expired %d leases of dead local workers %s", expired, dead)

    def _start(self, run: Run) -> None:
        task = asyncio.create_task(self._execute(run), name=f"run:{run.id}")
        self.active[run.id] = (task, run.lease_epoch)

    async def _execute(self, run: Run) -> str:
        outcome = "error"
        try:
            outcome = await execute_run(
                self.store,
                self.app,
                run,
                self.owner,
                stopping=self.stopping,
                park_threshold=self.config.park_threshold,
                max_resumes=self.config.max_resumes,
            )
            if outcome == RELEASED:
                await self.store.release_run(run.id, run.lease_epoch, self.owner)
            return outcome
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception:
            log.exception("run %s crashed the engine; its lease will expire", run.id)
            return outcome
        finally:
            if not self.stopping.is_set() or outcome not in ("cancelled",):
                self.active.pop(run.id, None)
            if self.on_finished is not None:
                self.on_finished(run.id, outcome)
            self._wake.set()

    # heartbeats -------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_seconds or self.config.lease_seconds / 3
        while not self.stopping.is_set():
            await asyncio.sleep(interval)
            leases = {run_id: epoch for run_id, (_, epoch) in self.active.items()}
            if leases:
                lost = await self.store.renew_leases(self.owner, leases, self.config.lease_seconds)
                for run_id in lost:
                    # A zombie: someone else owns the run now. Stop touching it.
                    entry = self.active.pop(run_id, None)
                    if entry is not None:
                        log.warning("lease on run %s lost; stopping it", run_id)
                        entry[0].cancel()
            await self.store.heartbeat_worker(self.owner)
