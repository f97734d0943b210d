"""Worker processes under chaos: start W ``agentledger worker`` processes, SIGKILL one
every S seconds (and start a replacement), SIGSTOP one past its lease and SIGCONT it later
(a zombie that wakes up believing it still holds its runs)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import agentledger


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the command dies (Linux), so a chaos
    session killed itself leaves no worker behind; elsewhere, nothing."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def worker_command(app: str, db: str, lease_seconds: float, concurrency: int) -> list[str]:
    """The command line of one worker process."""
    return [
        sys.executable,
        "-m",
        "agentledger.cli._main",
        "worker",
        "--app",
        app,
        "--db",
        db,
        "--lease-seconds",
        str(lease_seconds),
        "--poll-seconds",
        "0.05",
        "--concurrency",
        str(concurrency),
    ]


@dataclass
class Frozen:
    """A stopped worker and when it is thawed."""

    proc: subprocess.Popen[bytes]
    thaw_at: float


@dataclass
class WorkerPool:
    """Worker subprocesses of one app on one database."""

    app: str
    db: str
    size: int
    lease_seconds: float
    env: dict[str, str]
    log_dir: Path
    concurrency: int = 50
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    frozen: list[Frozen] = field(default_factory=list)
    kills: int = 0
    freezes: int = 0
    started: int = 0
    # Workers that ended by themselves (not killed, not stopped): each is restarted.
    exits: list[tuple[int, int, str]] = field(default_factory=list)
    logs: dict[int, int] = field(default_factory=dict)  # pid -> its log's number

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The same agentledger as this process, and the app's module from the current
        # directory as `python -m` finds it here.
        root = str(Path(agentledger.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [os.getcwd(), root, env.get("PYTHONPATH")])
        )
        env.update(self.env)
        return env

    def log_of(self, n: int) -> Path:
        return self.log_dir / f"worker-{n}.log"

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start one more worker, its output to its own log file."""
        self.started += 1
        with open(self.log_of(self.started), "ab") as log:
            proc = subprocess.Popen(
                worker_command(self.app, self.db, self.lease_seconds, self.concurrency),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                # Its own session: a Ctrl-C at the terminal reaches the command, which
                # stops the workers itself.
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.logs[proc.pid] = self.started
        self.procs.append(proc)
        return proc

    def start(self) -> WorkerPool:
        for _ in range(self.size):
            self.spawn()
        return self

    def up(self) -> bool:
        """Every live worker has said it started (its "started:" log line): runs
        submitted before that would all go to the first one up, and a kill or freeze
        needs a second worker to take its runs over."""
        for proc in self.procs:
            if proc.poll() is not None:
                continue
            log = self.log_of(self.logs[proc.pid])
            if not log.exists() or " started:" not in log.read_text(errors="replace"):
                return False
        return True

    def _is_frozen(self, proc: subprocess.Popen[bytes]) -> bool:
        return any(f.proc is proc for f in self.frozen)

    def running(self) -> list[subprocess.Popen[bytes]]:
        """Live workers that are not frozen."""
        return [p for p in self.procs if p.poll() is None and not self._is_frozen(p)]

    def gave_up(self) -> str | None:
        """Why the session should stop: workers keep ending by themselves (an app that
        does not import in a worker, a database they cannot open), or None."""
        if len(self.exits) < max(5, 2 * self.size):
            return None
        pid, code, line = self.exits[-1]
        return (
            f"{len(self.exits)} workers exited by themselves; the last ({pid}, exit {code}): {line}"
        )

    def tick(self) -> None:
        """Thaw the workers whose freeze is over; restart the ones that ended by themselves
        (until :meth:`gave_up`)."""
        now = time.monotonic()
        for f in [f for f in self.frozen if f.thaw_at <= now]:
            with contextlib.suppress(ProcessLookupError):
                f.proc.send_signal(signal.SIGCONT)
            self.frozen.remove(f)
        for proc in [p for p in self.procs if p.poll() is not None]:
            self.procs.remove(proc)
            log = self.log_of(self.logs[proc.pid])
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            self.exits.append((proc.pid, proc.returncode, tail[0] if tail else ""))
            if self.gave_up() is None:
                self.spawn()

    def kill_one(self, rng: random.Random, busy: Collection[int]) -> bool:
        """SIGKILL a random running worker that holds runs (``busy`` pids; nothing is
        flushed, its leases expire) and start a replacement. False when none holds a run:
        a worker still starting is not killed before it claimed anything, or a slow host
        would never let one work."""
        holding = [p for p in self.running() if p.pid in busy]
        if not holding:
            return False
        victim = rng.choice(holding)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.procs.remove(victim)
        self.kills += 1
        self.spawn()
        return True

    def freeze_one(self, rng: random.Random, seconds: float, busy: Collection[int]) -> bool:
        """SIGSTOP a random running worker that holds runs (``busy`` pids) for ``seconds``
        (longer than its lease: others take its runs over, then it wakes up a zombie).
        False when none holds a run (freezing an idle worker tests nothing) or it is the
        last one running: someone must take the runs over."""
        alive = self.running()
        holding = [p for p in alive if p.pid in busy]
        if len(alive) < 2 or not holding:
            return False
        victim = rng.choice(holding)
        victim.send_signal(signal.SIGSTOP)
        self.frozen.append(Frozen(victim, time.monotonic() + seconds))
        self.freezes += 1
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Thaw, SIGTERM every worker, wait, SIGKILL stragglers."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
        self.frozen.clear()
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
