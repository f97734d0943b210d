"""Running StayHub for real: worker subprocesses, the scripted guest, waiting and figures.

Used by ``agentledger demo`` and by the tests in ``tests/stayhub``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agentledger
import agentledger_examples as examples
from agentledger.records import RunStatus
from agentledger.store import Store

APP_PATH = "agentledger_examples.stayhub.app:app"
AGENT = "stayhub_booking"


def worker_command(db: str, *, lease_seconds: float = 2.0, poll_seconds: float = 0.05) -> list[str]:
    """The command line of one StayHub worker process."""
    return [
        sys.executable,
        "-m",
        "agentledger.cli._main",
        "worker",
        "--app",
        APP_PATH,
        "--db",
        db,
        "--lease-seconds",
        str(lease_seconds),
        "--poll-seconds",
        str(poll_seconds),
    ]


@dataclass
class WorkerPool:
    """Worker subprocesses on one database, pointed at one sandbox."""

    db: str
    stayhub_url: str
    size: int = 2
    lease_seconds: float = 2.0
    poll_seconds: float = 0.05
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    kills: int = 0
    started: int = 0

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The same agentledger and examples as this process, wherever they are installed.
        roots = [str(Path(agentledger.__file__).resolve().parents[1])]
        roots.append(str(Path(examples.__file__).resolve().parents[1]))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*roots, env.get("PYTHONPATH")]))
        env["STAYHUB_URL"] = self.stayhub_url
        env.update(self.env)
        return env

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start one more worker."""
        self.started += 1
        out: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            out = open(self.log_dir / f"worker-{self.started}.log", "ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                worker_command(
                    self.db, lease_seconds=self.lease_seconds, poll_seconds=self.poll_seconds
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self.procs.append(proc)
        return proc

    def start(self) -> WorkerPool:
        for _ in range(self.size):
            self.spawn()
        return self

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL one worker (nothing is flushed, its leases expire) and reap it."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            self.kills += 1
        proc.wait()
        with contextlib.suppress(ValueError):
            self.procs.remove(proc)

    def kill_random(self, rng: random.Random) -> int | None:
        """SIGKILL a random live worker and start a replacement; return the killed pid."""
        alive = self.alive()
        if not alive:
            self.spawn()
            return None
        victim = rng.choice(alive)
        self.kill(victim)
        self.spawn()
        return victim.pid

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every worker, wait, SIGKILL stragglers."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def approve_as_guests(store: Store, stop: asyncio.Event, poll: float = 0.05) -> int:
    """The scripted guest: approve every pending approval as ``guest:<guest_id>``.

    Uses the real approvals path: the run is parked ``waiting`` and the decision
    re-queues it. Returns the number of approvals given.
    """
    given = 0
    while not stop.is_set():
        for approval in await store.get_approvals(pending=True):
            args = approval.arguments if isinstance(approval.arguments, dict) else {}
            guest_id = args.get("guest_id", "unknown")
            with contextlib.suppress(Exception):  # decided elsewhere meanwhile
                await store.decide_approval(approval.id, "approve", f"guest:{guest_id}")
                given += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll)
    return given


async def wait_terminal(
    store: Store, run_ids: Iterable[str], timeout: float, poll: float = 0.1
) -> dict[str, str]:
    """Wait until every run is terminal (or the timeout); return run id -> status."""
    ids = list(run_ids)
    deadline = time.monotonic() + timeout
    while True:
        states = {}
        for run_id in ids:
            run = await store.get_run(run_id)
            states[run_id] = run.status if run else "missing"
        if all(s in RunStatus.TERMINAL for s in states.values()) or time.monotonic() > deadline:
            return states
        await asyncio.sleep(poll)


async def wait_outbox_drained(store: Store, timeout: float, poll: float = 0.2) -> Counter[str]:
    """Wait until no outbox row is pending (delivered or dead); return counts by status."""
    deadline = time.monotonic() + timeout
    while True:
        counts = Counter(item.status for item in await store.list_outbox())
        if not counts.get("pending") or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(poll)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def booking_input(rng: random.Random, n: int, script: str = "normal") -> dict[str, Any]:
    """A varied, deterministic run input."""
    from agentledger_examples.stayhub.sandbox.catalog import CITIES

    day = rng.randrange(0, 300)
    check_in = time.strftime("%Y-%m-%d", time.gmtime(1_798_761_600 + day * 86_400))  # 2027+
    return {
        "guest_id": f"g-{1000 + n}",
        "city": rng.choice(CITIES),
        "check_in": check_in,
        "nights": rng.randint(1, 4),
        "script": script,
    }
