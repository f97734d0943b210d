"""A PostgreSQL worker frozen (SIGSTOP, a stalled host) inside a store transaction holds
its run's row lock until the server ends that session (``idle_in_transaction_session_timeout``,
set on every store session): only then can another worker take the run over. The store
sets a timeout far below a minute, so a run whose worker froze mid-transaction is taken
over soon after its lease expired; the frozen worker, once it runs again, gives the run
up (its lease is lost) and executes nothing twice."""

from __future__ import annotations

import re
import signal
import subprocess
from typing import Any

import psycopg
import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env, tool_steps, wait_for
from tests.worker.procs import wait_log

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

# How long the test waits for the takeover: well past the store's idle-in-transaction
# timeout plus the lease (a loaded machine is slow to notice), and short of the minute
# a frozen session once held its row locks. A failure condition, not a measurement.
TAKEOVER_WAIT = 45.0
RENEWAL = "UPDATE runs SET lease_expires_at%"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def _one(url: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row (None when there is none), on a plain
    connection of the test's own (not a store session: none of the store's settings)."""
    with psycopg.connect(url, autocommit=True, application_name="test-watch") as conn:
        row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


def _renewal_waiting_on(url: str, holder_pid: int) -> int | None:
    """The backend of a lease renewal that waits for the row ``holder_pid`` holds."""
    pid = _one(
        url,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND %s = ANY(pg_blocking_pids(pid)) AND query LIKE %s",
        (holder_pid, RENEWAL),
    )
    return int(pid) if pid is not None else None


def _state(url: str, pid: int) -> str | None:
    """The backend's state in pg_stat_activity (None once its session has ended)."""
    state = _one(url, "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,))
    return str(state) if state is not None else None


def _row_locked(url: str, run_id: str) -> bool:
    """Whether another session holds a lock on the run's row."""
    with psycopg.connect(url, application_name="test-watch") as conn:
        try:
            conn.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE NOWAIT", (run_id,))
        except psycopg.errors.LockNotAvailable:
            return True
        finally:
            conn.rollback()
    return False


def _freeze_inside_a_renewal(env: Env, proc: subprocess.Popen[bytes], run_id: str) -> int:
    """SIGSTOP ``proc`` inside its lease renewal's transaction, holding the run's row lock;
    return the frozen session's backend pid.

    The test holds the run's row: the worker's next heartbeat waits for it inside its
    transaction. The worker is stopped while it waits; then the row is let go, the
    renewal's UPDATE completes on the server, and its COMMIT never comes: the session
    sits idle in its transaction, the row locked, its client frozen."""
    with psycopg.connect(env.url, application_name="test-holder") as holder:
        holder.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", (run_id,))
        holder_pid = holder.info.backend_pid
        backend = wait_for(
            lambda: _renewal_waiting_on(env.url, holder_pid),
            30,
            "the worker's lease renewal to wait for the held row",
        )
        proc.send_signal(signal.SIGSTOP)
        holder.rollback()
    wait_for(
        lambda: _state(env.url, backend) == "idle in transaction",
        30,
        "the frozen worker's renewal to sit idle inside its transaction",
    )
    return backend


def test_a_run_whose_worker_froze_inside_a_transaction_is_taken_over(pg_env: Env) -> None:
    env = pg_env
    flag = env.hold_flag("frozen")
    # Held inside its first write, after the effect: only the first worker holds there.
    hold = {"item": "i1", "phase": "after_effect", "flag": str(flag), "once": True}
    run_id = env.submit("five_writes", {"hold": hold})
    frozen = env.start_worker(lease=3.0, extra=("-v",))
    env.wait_marker(flag)
    owner = env.run(run_id).lease_owner
    assert owner is not None

    backend = _freeze_inside_a_renewal(env, frozen, run_id)
    try:
        assert _row_locked(env.url, run_id)
        env.start_worker()
        # Its claim skips the locked row: the run is taken over once the server has
        # ended the frozen session (its renewal rolled back, the lease long expired).
        wait_for(
            lambda: env.run(run_id).lease_epoch >= 2,
            TAKEOVER_WAIT,
            "another worker to take over the run of a worker frozen inside a transaction",
            0.25,
        )
        assert _state(env.url, backend) is None  # the frozen session was ended first
        done = env.wait_status(run_id, RunStatus.COMPLETED, timeout=60)
        assert done.lease_epoch == 2, done
        journal, events = env.journal(run_id), env.events(run_id)
        claims = [(e.data, e.actor) for e in events if e.type == "run.claimed"]
        assert [data for data, _ in claims] == [{"epoch": 1}, {"epoch": 2}], claims
        assert claims[1][1] != owner, claims  # taken over by the other worker
        flag.unlink()  # the frozen worker's tool call returns as soon as it runs again
    finally:
        frozen.send_signal(signal.SIGCONT)

    # Woken, it finds its session gone (one line, no traceback), its lease lost, and
    # gives the run up: nothing it does after is accepted.
    log = wait_log(env, 1, "store connection lost", timeout=60)
    wait_for(
        lambda: (
            f"lease on run {run_id} (epoch 1) lost" in env.worker_log(1)
            or f"run {run_id} abandoned: lease lost" in env.worker_log(1)
        ),
        60,
        f"the woken worker to give the run up; its log: {env.tmp}/worker1.log",
    )
    log = env.worker_log(1)
    assert "Traceback" not in log, log
    (lost,) = [line for line in log.splitlines() if "store connection lost" in line]
    assert "idle-in-transaction timeout" in lost, lost
    assert all(LOG_LINE.match(line) for line in log.splitlines()), log
    assert frozen.poll() is None, log  # the process lives on; it only lost that run
    assert env.journal(run_id) == journal
    assert [e.id for e in env.events(run_id)] == [e.id for e in events]
    run = env.run(run_id)
    assert run.status == RunStatus.COMPLETED and run.lease_epoch == 2, run
    writes = tool_steps(journal, "keyed_write")
    assert len(writes) == 5
    assert env.effects("keyed") == {s.idempotency_key: 1 for s in writes}
    assert all(env.calls("keyed")[s.idempotency_key] == 1 for s in writes)
