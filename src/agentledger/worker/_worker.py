"""The worker process: claim, lease, heartbeat, execute, shut down cleanly.

Side tasks (claim loop, heartbeat, outbox dispatcher, and the companions its builder
composed: the webhook dispatcher, the stuck-run detector) are supervised. A transient
store error (the database is locked, the connection is being re-established) never
stops a worker: the loop logs it and retries with a backoff. Any other error in a side
task stops the worker, which then raises :class:`WorkerFailed` so that the process
exits non-zero and a process manager restarts it.

SIGTERM/SIGINT: stop claiming and delivering; each run stops at its next step boundary
and is released (queued again, lease cleared); runs still inside a step after the grace
period are cancelled and released -- a write left ``started`` is resolved by the next
owner through the unknown-outcome path. Heartbeats go on until the drain is over, so a
run still executing is never stolen while the grace lasts. A second SIGINT (Ctrl-C)
during the grace ends it at once: what is still in flight is cancelled and released.
Each released run gets a ``run ... released`` line. Exit code 0. A signal that
arrives while the worker command still starts (app import, store open) also exits 0
(:mod:`agentledger.worker._startup_signals`).

Burst mode (``agentledger worker --burst``): the worker stops by itself, exit code 0,
once nothing is left that it could run now: its own runs rested, a claim finds no due
queued or waiting run of its targets and no lease of a dead or expired owner to take
over, and no outbox row is due. Runs parked until later are left for later. Before it
exits it seals the audit records its runs wrote and runs its companions' exit passes
(the webhook dispatcher delivers, once, the webhooks that last seal enqueued; a failed
delivery is retried by the next dispatcher).

Drain mode (``agentledger worker --exit-when-drained``, docs/architecture.md "Versions"):
the worker stops by itself, exit code 0, once no run of its targets is left at all --
none queued, running or waiting (parked for a backoff, a sleep or an approval counts:
it is still the old version's to finish) -- and no outbox row is due. A target a live
worker that is not draining also serves does not count: that worker takes its runs. The
old version's workers of a deploy run so, beside the new version's, and leave when their
work is done.

A store error the run did not cause (disk full, I/O error, read-only database, lost
connection: :class:`StoreUnavailable`) never abandons a run silently. The engine retries
the journal write with backoff for ``store_retry_seconds``; then the worker gives the
run back (``release_run``, retried as long again) so another worker takes it at once,
and logs the cause once at ERROR. When even the release fails, the run is left to its
lease, which another worker takes over when it expires or when it sees this process
gone, and the log says so. A long-running worker goes on (its claims are retried); a
burst worker stops claiming and exits non-zero, naming the cause. A store error the run
caused (a value the store refuses) is not retried this way: the run is left to its
lease and, failing again, goes to a human after ``max_resumes``.

Logging (the ``agentledger.worker`` logger): a startup line, then one line per change of
a run's state (claimed, completed, failed with its error and traceback, needs_human with
the reason, waiting with why, released); at DEBUG, each step the execution journaled.

Leases are renewed per (run, lease epoch): a renewal that reports a lost lease only
stops the execution that held that epoch, never a newer execution of the same run
this worker claimed since. And one process never executes one run twice at once: a
run re-claimed while its previous execution is still unwinding waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentledger import _auditchain as auditchain
from agentledger import _prune as prune
from agentledger import _rollup as rollup
from agentledger import _sealer as sealer
from agentledger._app import App
from agentledger._backoff import Backoff
from agentledger._extras import MissingFeature
from agentledger._failures import FailureLog, cause_of
from agentledger.engine._runner import Stopped, execute_run
from agentledger.errors import AgentLedgerError, StoreError, StoreUnavailable
from agentledger.records import Run, RunStatus, WorkerInfo
from agentledger.store._sqlstore import Store, redacted_url
from agentledger.worker._companions import Companion
from agentledger.worker._config import WorkerConfig
from agentledger.worker._liveness import LIVE_WITHIN, is_dead_local_owner, me
from agentledger.worker._runlog import log_outcome

log = logging.getLogger("agentledger.worker")


class WorkerFailed(AgentLedgerError):
    """The worker stopped on an error it cannot recover from (the message says which)."""


def is_transient(exc: BaseException) -> bool:
    """True for a store error that retrying later may cure (locked, reconnecting)."""
    return isinstance(exc, StoreUnavailable) or (
        isinstance(exc, StoreError) and bool(getattr(exc, "transient", False))
    )


class Worker:
    """Runs many runs concurrently on one asyncio loop."""

    def __init__(
        self,
        store: Store,
        app: App,
        config: WorkerConfig | None = None,
        *,
        burst: bool = False,
        exit_when_drained: bool = False,
        companions: Sequence[Companion] = (),
    ) -> None:
        self.store = store
        self.app = app
        self.config = config or WorkerConfig()
        self.burst = burst  # stop once nothing is left to run now (see the module docstring)
        self.exit_when_drained = exit_when_drained  # stop once its targets have no run left
        # Features' side tasks (worker/_companions.py): the webhook dispatcher, the
        # stuck-run detector, as the builder composed them.
        self.companions = tuple(companions)
        self.identity = me()
        self.owner = str(self.identity)
        self.stopping = asyncio.Event()  # stop claiming; runs stop at a step boundary
        self._hurry = asyncio.Event()  # a second Ctrl-C: end the grace now
        self._drained = asyncio.Event()  # every run is released: heartbeats may stop
        self.active: dict[str, tuple[asyncio.Task[str], int]] = {}
        # run id -> reason, refreshed by the heartbeat loop; the engine reads it live.
        self.cancel_requests: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._failure: str | None = None
        self._last_reap = 0.0
        # The latest execution task of each run, also while it unwinds after its lease
        # was lost (it is then no longer in ``active``).
        self._tasks: dict[str, asyncio.Task[str]] = {}
        # (run id, epoch) of executions the engine has returned from: their lease was
        # given back (or is about to be), so a renewal that misses it is no loss.
        self._ended: set[tuple[str, int]] = set()
        # Store failures of every loop and run, each cause logged once at ERROR.
        self._store_log = FailureLog(log)
        # Runs given back unfinished because the store failed, and the first cause.
        self._given_back = 0
        self._given_back_cause: str | None = None
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

    def _signalled(self, sig: signal.Signals) -> None:
        """SIGTERM/SIGINT: stop. A SIGINT while already stopping ends the grace at once
        (the person pressing Ctrl-C again does not want to wait it out)."""
        if sig == signal.SIGINT and self.stopping.is_set() and not self._hurry.is_set():
            in_flight = sum(1 for task, _ in self.active.values() if not task.done())
            log.warning(
                "second signal (%s): stopping now; %d runs in flight are released",
                sig.name,
                in_flight,
            )
            self._hurry.set()
        self.stop()

    async def run(self, install_signals: bool = True) -> None:
        """Work until stopped (SIGTERM/SIGINT or :meth:`stop`).

        Raises :class:`WorkerFailed` when it stopped on an unrecoverable error, and
        :class:`~agentledger._extras.MissingFeature` before it starts when nothing in
        the process would seal the audit records its runs write (``agentledger.service``
        never imported: ``agentledger/_auditchain.py``).
        """
        auditchain.required("a worker", "claimed")
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._signalled, sig)
        await self.app.startup()
        side: list[asyncio.Task[None]] = []
        stop_listening = None
        try:
            info = WorkerInfo(
                id=self.owner,
                host=socket.gethostname(),
                pid=os.getpid(),
                targets=self.targets,
                started_at=time.time(),
                heartbeat_at=time.time(),
                draining=self.exit_when_drained,
            )
            await self._retrying(
                "register", lambda: self.store.register_worker(info, self.app.targets())
            )
            log.info(
                "worker %s started: app %s, database %s, targets %s, concurrency %d, lease %g s%s",
                self.owner,
                self.app.name,
                redacted_url(str(getattr(self.store, "url", "?"))),
                ", ".join(self.targets) or "none",
                self.config.concurrency,
                self.config.lease_seconds,
                ", burst" if self.burst else "",
            )
            side = [
                asyncio.create_task(self._supervise("claim", self._claim_once), name="claim"),
                asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            ]
            if self.config.outbox:
                side.append(asyncio.create_task(self._outbox_loop(), name="outbox"))
            for companion in self.companions:  # composed by whoever built this worker
                side.append(
                    asyncio.create_task(self._companion_loop(companion), name=companion.name)
                )
            # The audit chain is sealed where its records are written (agentledger/_sealer.py).
            seal_every = sealer.period_from_env()
            sealer.key_at_start()
            side.append(
                asyncio.create_task(
                    sealer.seal_forever(self.store, seal_every, self._store_log), name="seal"
                )
            )
            # The daily rollup the numbers and metrics read (agentledger/_rollup.py).
            side.append(
                asyncio.create_task(
                    rollup.fold_forever(self.store, failures=self._store_log), name="rollup"
                )
            )
            if self.config.prune_every is not None:  # agentledger/_prune.py
                side.append(
                    asyncio.create_task(
                        prune.prune_forever(self.store, self.config.prune_every, self._store_log),
                        name="prune",
                    )
                )
            for task in side:
                task.add_done_callback(self._side_task_done)
            # PostgreSQL wakes us on NOTIFY; polling stays as the fallback.
            listen = getattr(self.store, "listen", None)
            stop_listening = (
                listen(lambda: loop.call_soon_threadsafe(self.wake)) if listen else None
            )
            await self.stopping.wait()
            # The claim loop ends on its own once stopping (what it claimed meanwhile it
            # gives back): wait for it, so that no claim commits after the drain and is
            # then cancelled with the side tasks, leaving runs leased to a gone worker.
            await asyncio.wait({side[0]}, timeout=self.config.shutdown_grace)
            await self._drain()
            # What its last runs wrote.
            await sealer.seal_before_exit(self.store, failures=self._store_log)
            for companion in self.companions:
                if companion.at_exit is not None:
                    await companion.at_exit(self)
        finally:
            self._drained.set()
            for task in side:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            if stop_listening is not None:
                await asyncio.to_thread(stop_listening)
            with contextlib.suppress(Exception):
                await self.store.deregister_worker(self.owner)
            await self.app.shutdown()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        if self._failure is not None:
            raise WorkerFailed(self._failure)
        if self.burst and self._given_back:
            raise WorkerFailed(
                f"{self._given_back} run(s) not finished because the store failed: "
                f"{self._given_back_cause}; see the log for which were released"
            )

    def _side_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.get_name(), task.exception() or RuntimeError("?"))

    def _fail(self, what: str, exc: BaseException) -> None:
        """An unrecoverable error in a side task: stop, and exit non-zero."""
        reason = cause_of(exc)
        if self._failure is None:
            self._failure = f"{what}: {reason}"
        # The reason is raised by run() (the CLI prints it as its last line).
        log.info("worker %s failed: %s; stopping", what, reason)
        self.stop()

    async def _retrying(
        self, what: str, fn: Callable[[], Awaitable[Any]], window: float | None = None
    ) -> Any:
        """Call ``fn`` until it does not meet a transient store error; with ``window``,
        the last error is raised once that many seconds have passed."""
        backoff = Backoff()
        deadline = None if window is None else time.monotonic() + window
        while True:
            try:
                return await fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self._store_log.failed(what, exc)
                pause = backoff.next()
                if deadline is not None and time.monotonic() + pause > deadline:
                    raise
                await asyncio.sleep(pause)

    async def _supervise(self, what: str, once: Callable[[], Awaitable[None]]) -> None:
        """Call ``once`` until stopping; retry transient errors, stop on any other (and,
        in burst mode, on a transient one that lasts past ``store_retry_seconds``)."""
        backoff = Backoff()
        failing_since: float | None = None
        while not self.stopping.is_set():
            try:
                await once()
                backoff.reset()
                failing_since = None
                self._store_log.recovered(what)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if not is_transient(exc) or (
                    self.burst and now - failing_since > self.config.store_retry_seconds
                ):
                    self._fail(what, exc)
                    return
                self._store_log.failed(what, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), backoff.next())

    async def _give_back(self, run_id: str, epoch: int) -> bool:
        """Release a run this worker cannot finish, retried for ``store_retry_seconds``;
        False when the store still refuses (the run is then left to its lease), or when
        the lease of ``epoch`` is no longer this worker's to give back."""
        try:
            released = await self._retrying(
                f"release of run {run_id}",
                lambda: self.store.release_run(run_id, epoch, self.owner),
                self.config.store_retry_seconds,
            )
        except Exception as exc:
            log.error(
                "run %s not released (%s); another worker takes it over when its lease "
                "expires, or at once when it finds this worker gone",
                run_id,
                "the store still fails, see above" if self._store_log.knows(exc) else cause_of(exc),
            )
            return False
        if not released:
            # The release is fenced by epoch and owner: while the store refused this
            # worker's writes its lease expired and another worker took the run (or an
            # earlier attempt of this release committed, its answer lost).
            log.info(
                "run %s not given back: its lease (epoch %d) is no longer this worker's "
                "(taken over by another worker, or already released)",
                run_id,
                epoch,
            )
        return bool(released)

    async def _drain(self) -> None:
        tasks = [task for task, _ in self.active.values()]
        log.info(
            "stopping: draining %d runs (up to %g s to reach a step boundary); leases are "
            "still renewed",
            len(tasks),
            self.config.shutdown_grace,
        )
        if tasks:
            # Until every run is at a boundary, the grace is over, or a second Ctrl-C.
            settled = asyncio.ensure_future(asyncio.wait(tasks))
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                (settled, hurry),
                timeout=self.config.shutdown_grace,
                return_when=asyncio.FIRST_COMPLETED,
            )
            settled.cancel()  # the wait, not the runs
            hurry.cancel()
            pending = [task for task in tasks if not task.done()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, settled, hurry, return_exceptions=True)
        why = "the second signal" if self._hurry.is_set() else "the end of the grace"
        # All at once: each release may retry for store_retry_seconds while the store
        # fails, and one after another the drain would last that long per run.
        held = list(self.active.items())
        released = await asyncio.gather(*(self._give_back(r, epoch) for r, (_, epoch) in held))
        for (run_id, _), done in zip(held, released, strict=True):
            if done:
                log.info(
                    "run %s released (stopped inside a step by %s; the next owner settles "
                    "that step)",
                    run_id,
                    why,
                )
        self.active.clear()

    # outbox ---------------------------------------------------------------

    async def _outbox_loop(self) -> None:
        from agentledger._outbox import OutboxDispatcher

        # An outbox claim is a lease too: a SIGKILLed worker's claims must expire about
        # as fast as its run leases, yet outlast one delivery (bounded by the tool timeout).
        timeouts = [t.timeout for t in self.app.tools.values() if t.delivery == "outbox"]
        outbox_lease = max([self.config.lease_seconds, *(2 * t + 1 for t in timeouts)])
        dispatcher = OutboxDispatcher(
            self.store, self.app, owner=self.owner, lease_seconds=outbox_lease
        )
        await self._supervise("outbox", lambda: dispatcher.run(self.stopping))

    async def _companion_loop(self, companion: Companion) -> None:
        await self._supervise(companion.name, companion.loop(self))

    # claiming -------------------------------------------------------------

    async def _claim_once(self) -> None:
        """Reap, claim what fits, then wait for a wake-up or the poll interval."""
        now = time.monotonic()
        if self.config.reap_dead_local_owners and now - self._last_reap >= self.config.reap_seconds:
            self._last_reap = now
            await self._reap_dead_local_owners()
        free = self.config.concurrency - len(self.active)
        if free > 0:
            runs = await self.store.claim_runs(
                self.owner, self.targets, free, self.config.lease_seconds
            )
            if self.stopping.is_set():
                # Claimed while the stop arrived: give them back at once.
                for run in runs:
                    await self.store.release_run(run.id, run.lease_epoch, self.owner)
                return
            for run in runs:
                self._start(run)
            if runs and len(runs) == free:
                return
            if self.burst and not runs and not self.active and await self._nothing_left():
                log.info("worker %s: nothing left to run now (burst); stopping", self.owner)
                self.stop()
                return
            idle = not runs and not self.active
            if self.exit_when_drained and idle and await self._no_run_left():
                log.info(
                    "worker %s: no run of %s left (drained); stopping",
                    self.owner,
                    ", ".join(self.targets) or "its targets",
                )
                self.stop()
                return
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.config.poll_seconds)

    async def _nothing_left(self) -> bool:
        """Burst mode: True when no run or outbox row is left that this worker could
        take now. Leases of dead local owners are expired first, so their runs are
        claimable; a claim then finds every due run, expired leases included."""
        if self.config.reap_dead_local_owners:
            await self._reap_dead_local_owners()
        runs = await self.store.claim_runs(
            self.owner, self.targets, self.config.concurrency, self.config.lease_seconds
        )
        for run in runs:
            self._start(run)
        if runs:
            return False
        if self.config.outbox:
            from agentledger._outbox import OutboxDispatcher

            dispatcher = OutboxDispatcher(self.store, self.app, owner=self.owner)
            if await dispatcher.drain():
                return False  # a delivery may have re-queued a run: look again
        return True

    async def _no_run_left(self) -> bool:
        """Drain mode: True when no run of this worker's targets is left in any
        non-terminal state (parked ones included) and nothing is left to run now.

        A target another live worker serves without draining (the new deploy has the
        same version of it) is that worker's: its runs do not keep this one. Draining
        workers never cover for each other: the last old worker waits for the last run."""
        live = await self.store.list_workers(live_within=LIVE_WITHIN)
        covered = {t for w in live if w.id != self.owner and not w.draining for t in w.targets}
        if await self.store.open_runs([t for t in self.targets if t not in covered]):
            return False
        return await self._nothing_left()

    async def _reap_dead_local_owners(self) -> None:
        dead = [o for o in await self.store.lease_owners() if is_dead_local_owner(o, self.identity)]
        if dead:
            expired = await self.store.expire_leases_of(dead)
            log.info("expired %d leases of dead local workers %s", expired, dead)

    def _start(self, run: Run) -> None:
        previous = self._tasks.get(run.id)
        log.info(
            "run %s (%s) claimed, epoch %d%s",
            run.id,
            getattr(run, "target", "?"),
            run.lease_epoch,
            f" (resume {run.resumes})" if getattr(run, "resumes", 0) else "",
        )
        task = asyncio.create_task(self._execute(run, previous), name=f"run:{run.id}")
        self.active[run.id] = (task, run.lease_epoch)
        self._tasks[run.id] = task

    async def _execute(self, run: Run, previous: asyncio.Task[str] | None = None) -> str:
        outcome = "error"
        try:
            if previous is not None and not previous.done():
                # Our own earlier execution of this run lost its lease but is still
                # unwinding (e.g. inside a tool call): never run two attempts of one
                # step at once. Its writes are fenced by the old epoch anyway.
                previous.cancel()
                await asyncio.gather(previous, return_exceptions=True)
            outcome = await execute_run(
                self.store,
                self.app,
                run,
                self.owner,
                stopping=self.stopping,
                park_threshold=self.config.park_threshold,
                max_resumes=self.config.max_resumes,
                store_retry_seconds=self.config.store_retry_seconds,
                cancel_requests=self.cancel_requests,
            )
            self._ended.add((run.id, run.lease_epoch))
            if outcome == Stopped.RELEASED:
                await self._retrying(
                    f"release of run {run.id}",
                    lambda: self.store.release_run(run.id, run.lease_epoch, self.owner),
                )
            await log_outcome(self.store, run, outcome)
            return outcome
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except MissingFeature as exc:
            # A step needs a feature this process never imported (engine/_hooks.py): the
            # run goes back untouched for a worker that has it, and this one stops, loud.
            outcome = Stopped.RELEASED
            await self._give_back(run.id, run.lease_epoch)
            self._fail(f"run {run.id}", exc)
            return outcome
        except Exception as exc:
            if is_transient(exc):
                # The store failed mid-run (the engine retried its write): nothing was
                # written past the journal, so give the run back for another worker.
                self._store_log.failed(f"run {run.id}", exc)
                outcome = Stopped.RELEASED
                if await self._give_back(run.id, run.lease_epoch):
                    log.info("run %s released for another worker (the store failed)", run.id)
                self._given_back += 1
                if self._given_back_cause is None:
                    self._given_back_cause = str(exc).splitlines()[0] if str(exc) else "?"
                if self.burst and not self.stopping.is_set():
                    # It could not finish its work: stop claiming, exit non-zero.
                    log.info("stopping: a run was given back because the store failed")
                    self.stop()
            else:
                log.exception("run %s crashed the engine; its lease will expire", run.id)
            return outcome
        finally:
            # Only our own entries: a newer execution of this run may have replaced them.
            # A run cancelled by the drain stays in ``active`` so that the drain releases it
            # -- also one cancelled while giving itself back, its release maybe not done
            # (the drain's release of a run already given back is refused, harmlessly).
            task = asyncio.current_task()
            cancelled = outcome == "cancelled" or (task is not None and task.cancelling() > 0)
            entry = self.active.get(run.id)
            if (
                entry is not None
                and entry[1] == run.lease_epoch
                and not (self.stopping.is_set() and cancelled)
            ):
                del self.active[run.id]
                self.cancel_requests.pop(run.id, None)
            if self._tasks.get(run.id) is asyncio.current_task():
                del self._tasks[run.id]
            self._ended.discard((run.id, run.lease_epoch))
            if self.on_finished is not None:
                self.on_finished(run.id, outcome)
            self._wake.set()

    # heartbeats -------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Renew leases until every run is released (through a SIGTERM drain too)."""
        interval = self.config.heartbeat_interval
        backoff = Backoff()
        while not self._drained.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), interval)
            if self._drained.is_set():
                return
            try:
                await self._heartbeat_once()
                backoff.reset()
                self._store_log.recovered("heartbeat")  # a heartbeat always writes
                interval = self.config.heartbeat_interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_transient(exc):
                    self._fail("heartbeat", exc)
                    return
                self._store_log.failed("heartbeat", exc)
                interval = min(backoff.next(), self.config.heartbeat_interval)

    async def _heartbeat_once(self) -> None:
        leases = {run_id: epoch for run_id, (_, epoch) in self.active.items()}
        if leases:
            lost = await self.store.renew_leases(self.owner, leases, self.config.lease_seconds)
            for run_id in lost:
                entry = self.active.get(run_id)
                # Only the execution that held the lost epoch: a newer one of the same
                # run (re-claimed while this renewal was in flight) keeps running.
                if entry is None or entry[1] != leases[run_id]:
                    continue
                if (run_id, entry[1]) in self._ended or not await self._lost(run_id, entry[1]):
                    continue  # the execution gave the lease back itself: it is finishing
                if self.active.get(run_id) == entry:
                    del self.active[run_id]
                    log.warning("lease on run %s (epoch %d) lost; stopping it", run_id, entry[1])
                    entry[0].cancel()
            await self._refresh_cancel_requests([r for r in leases if r not in lost])
        await self.store.heartbeat_worker(self.owner)

    async def _lost(self, run_id: str, epoch: int) -> bool:
        """Was the lease of ``epoch`` taken from us, rather than given back by the run?

        A renewal that races the run's own last write (finish, park or release, which
        clear the lease under the fence) misses it. Only that write moves a run out of
        ``running`` without a new epoch; any other miss is a real loss: the lease was
        taken over (a newer epoch) or the run was deleted."""
        run = await self.store.get_run(run_id)
        return run is None or run.lease_epoch != epoch or run.status == RunStatus.RUNNING

    async def _refresh_cancel_requests(self, run_ids: list[str]) -> None:
        if not run_ids:
            return
        found = await self.store.cancel_requests(run_ids)
        for run_id in run_ids:
            if run_id in found:
                self.cancel_requests[run_id] = found[run_id]
            else:
                self.cancel_requests.pop(run_id, None)
