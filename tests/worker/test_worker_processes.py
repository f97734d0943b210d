"""Worker guarantees that are about processes: namespaces, SIGTERM, a locked database."""

from __future__ import annotations

import signal
import sqlite3

import pytest

from agentledger.records import RunStatus, StepStatus
from agentledger.worker._liveness import parse_owner, read_pid_namespace
from tests.engine.helpers import Env, tool_steps, wait_for
from tests.worker.procs import pid_namespace_prefix, wait_log

pytestmark = pytest.mark.slow


def _held_run(env: Env, item: str = "i1") -> tuple[str, object]:
    flag = env.tmp / "hold.flag"
    flag.write_text("hold")
    run_id = env.submit(
        "five_writes", {"hold": {"item": item, "phase": "after_effect", "flag": str(flag)}}
    )
    return run_id, flag


def _effects_of(env: Env, run_id: str) -> dict[str, int]:
    return {k: n for k, n in env.effects("keyed").items() if k.startswith(run_id)}


def test_a_worker_in_its_own_pid_namespace_is_not_reaped(env: Env) -> None:
    """Same hostname, another PID namespace: its pid means nothing outside; never reaped."""
    prefix = pid_namespace_prefix()
    run_id, flag = _held_run(env)
    inside = env.start_worker(prefix=prefix, concurrency=1)  # busy: takes no other run
    env.wait_marker(flag)  # type: ignore[arg-type]
    held = env.run(run_id)
    owner = parse_owner(held.lease_owner or "")
    assert owner is not None and owner.pid_ns != read_pid_namespace()
    outside = env.start_worker()
    # The outside worker reaps before its first claim: once it has completed a run
    # submitted after it started, it has judged the inside worker's lease.
    quick = env.submit("quick", {"n": 1})
    env.wait_status(quick, RunStatus.COMPLETED)
    by = {parse_owner(e.actor) for e in env.events(quick)} - {None}
    assert by and all(o.pid_ns == read_pid_namespace() for o in by if o), by
    run = env.run(run_id)
    assert run.lease_owner == held.lease_owner and run.lease_epoch == 1, run
    assert not any(e.type == "run.resumed" for e in env.events(run_id))
    flag.unlink()  # type: ignore[attr-defined]
    run = env.wait_status(run_id, RunStatus.COMPLETED)
    assert run.lease_epoch == 1 and run.resumes == 0, run
    writes = tool_steps(env.journal(run_id), "keyed_write")
    assert _effects_of(env, run_id) == {s.idempotency_key: 1 for s in writes}
    assert inside.poll() is None and outside.poll() is None


def test_heartbeats_go_on_during_a_sigterm_drain(env: Env) -> None:
    """A grace longer than the lease: the run still executing is not stolen meanwhile."""
    run_id, flag = _held_run(env)
    # The grace (30 s) outlasts the lease (6 s): without heartbeats the run would be
    # stolen. Renewed every 0.2 s, the lease still outlasts a stall of the loaded
    # machine (with a 1 s lease, a stall of 0.7 s let the other worker take the run).
    first = env.start_worker(
        lease=6.0, extra=("--heartbeat-seconds", "0.2", "--shutdown-grace", "30", "-v")
    )
    env.wait_marker(flag)  # type: ignore[arg-type]
    first.send_signal(signal.SIGTERM)
    wait_log(env, 1, "draining 1 runs")
    other = env.start_worker()
    # Renewed at least thrice after the drain began (each renewal extends the lease).
    seen = [env.run(run_id).lease_expires_at or 0.0]

    def renewed() -> bool:
        expires = env.run(run_id).lease_expires_at or 0.0
        if expires > seen[-1]:
            seen.append(expires)
        return len(seen) >= 4

    wait_for(renewed, 15, "lease renewals during the drain")
    run = env.run(run_id)
    assert run.status == RunStatus.RUNNING and run.lease_epoch == 1, run
    flag.unlink()  # type: ignore[attr-defined]
    assert first.wait(timeout=30) == 0
    run = env.wait_status(run_id, RunStatus.COMPLETED)
    journal = env.journal(run_id)
    # The held write was finished and journaled by the first worker before it let go.
    held = tool_steps(journal, "keyed_write")[0]
    assert held.status == StepStatus.SUCCEEDED and held.lease_epoch == 1
    assert not any(e.type == "tool.resumed_unknown" for e in env.events(run_id))
    writes = tool_steps(journal, "keyed_write")
    assert env.effects("keyed") == {s.idempotency_key: 1 for s in writes}
    assert env.calls("keyed") == {s.idempotency_key: 1 for s in writes}
    assert other.poll() is None


def _repeats(log: str) -> int:
    """Lines of the lock's cause met again (DEBUG, after the ERROR line)."""
    return sum(
        " DEBUG " in line and "locked" in line and line.endswith("; retrying")
        for line in log.splitlines()
    )


def test_a_locked_database_does_not_stop_the_worker(env: Env) -> None:
    """Another process holds the write lock past the busy timeout: the worker waits it out."""
    ids = [env.submit("slow_writes", {"tag": f"t{n}", "n": 3, "pause": 0.2}) for n in range(3)]
    # -v: the cause is logged once at ERROR, its repeats at DEBUG (each retry).
    worker = env.start_worker(db=f"{env.url}?busy_timeout_ms=200", extra=("-v",))
    with env.one_store():
        wait_for(lambda: all(env.run(i).step_count >= 1 for i in ids), what="all runs started")
    holder = sqlite3.connect(env.db_path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        # The worker met the lock and said so (the ERROR line), then met it again and
        # again, each repeat at DEBUG. Waited for by those lines: a failed read logs a
        # warning that also names the lock and says "retrying", and may come first.
        wait_log(env, 1, "store failing")
        wait_for(lambda: _repeats(env.worker_log(1)) >= 3, what="several retries")
        log = env.worker_log(1)
        assert log.count("ERROR") == 1 and log.count("WARNING agentledger.service._webhooks") <= 1
        assert worker.poll() is None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    for run_id in ids:
        env.wait_status(run_id, RunStatus.COMPLETED)
    assert worker.poll() is None
    keys = [s.idempotency_key for i in ids for s in tool_steps(env.journal(i), "keyed_write")]
    assert len(keys) == 9
    assert env.effects("keyed") == dict.fromkeys(keys, 1)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


@pytest.mark.parametrize("damage", ["schema_dropped", "file_replaced_by_garbage"])
def test_an_unrecoverable_store_error_exits_non_zero_with_its_reason(env: Env, damage: str) -> None:
    worker = env.start_worker()
    env.wait_status(env.submit("quick", {"n": 1}), RunStatus.COMPLETED)
    if damage == "schema_dropped":
        with sqlite3.connect(env.db_path) as conn:
            conn.execute("DROP TABLE runs")
    else:
        # Everything into the main file first (WAL mode): with pages left in the WAL the
        # worker could go on reading them and notice the damage only at random later.
        with sqlite3.connect(env.db_path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = env.db_path.stat().st_size
        with open(env.db_path, "r+b") as f:  # in place: the worker's open file changes
            f.write(b"this is not a database" * (size // 22 + 1))
    assert worker.wait(timeout=30) != 0
    log = env.worker_log(1)
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines[-1].startswith("error: worker stopped:"), log
