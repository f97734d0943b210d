"""A store error the run did not cause (a full disk, a database that refuses writes)
never abandons a run silently: the worker retries the write with backoff, gives the
run back for another worker, logs the cause once, and a ``--burst`` worker that could
not finish its work exits non-zero. Real worker subprocesses on a real SQLite file
(whose process hits its file size limit) and a real PostgreSQL cluster (made
read-only)."""

from __future__ import annotations

import asyncio
import resource
import signal
from pathlib import Path

import psycopg
import pytest

from agentledger.records import RunStatus, StepStatus
from agentledger.store import open_store
from tests.engine.helpers import Env, tool_steps, wait_for
from tests.pgcluster import PrivateCluster

pytestmark = pytest.mark.slow

RUNS = 3


def _ignore_sigxfsz() -> None:
    # A write past the file size limit then fails with EFBIG (SQLite: "disk I/O
    # error") instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _held_runs(env: Env, phase: str = "before_started") -> tuple[list[str], list[Path]]:
    """RUNS five_writes runs, each held at ``phase`` of its second write (its first is
    done): before it started, or after its effect (made, its outcome not journaled)."""
    flags = [env.hold_flag(f"run{i}") for i in range(RUNS)]
    runs = [
        env.submit("five_writes", {"hold": {"item": "i2", "phase": phase, "flag": str(f)}})
        for f in flags
    ]
    return runs, flags


def _wait_held(env: Env, flags: list[Path]) -> None:
    for flag in flags:
        env.wait_marker(flag)


def _finish_elsewhere(env: Env, runs: list[str], db: str | None = None) -> None:
    """A second worker (long lease: nothing waits for an expiry) completes every run,
    and no step was executed twice: one effect and one call per write key."""
    second = env.start_worker(lease=300, extra=("--burst",), db=db)
    assert second.wait(timeout=120) == 0, env.worker_log(2)
    _done_once(env, runs)


def _done_once(env: Env, runs: list[str]) -> None:
    """Every run completed, and no step was executed or journaled twice."""
    for run_id in runs:
        run = env.run(run_id)
        assert run.status == RunStatus.COMPLETED, (run, env.worker_log(2))
        journal = env.journal(run_id)
        assert all(s.status == StepStatus.SUCCEEDED for s in journal)
        assert len([s.step_no for s in journal]) == len({s.step_no for s in journal})
        keys = [s.idempotency_key for s in tool_steps(journal, "keyed_write")]
        assert len(keys) == 5
        assert {k: env.effects("keyed")[k] for k in keys} == dict.fromkeys(keys, 1)
        assert {k: env.calls("keyed")[k] for k in keys} == dict.fromkeys(keys, 1)


def _check_first_log(log: str, cause: str, runs: list[str]) -> None:
    assert "nothing left to run now" not in log, log
    # The cause is logged once as an error, not per write or per run, and the exit
    # line names it.
    errors = [line for line in log.splitlines() if " ERROR " in line and cause in line]
    assert len(errors) == 1, log
    assert cause in log.strip().splitlines()[-1], log
    assert log.strip().splitlines()[-1].startswith("error: worker stopped:"), log
    for run_id in runs:
        assert f"run {run_id} released" in log or f"run {run_id} not released" in log, log


def test_burst_worker_on_a_full_disk_exits_non_zero_and_its_runs_are_taken_at_once(
    env: Env,
) -> None:
    runs, flags = _held_runs(env)
    first = env.start_worker(
        lease=300, extra=("--burst", "--store-retry-seconds", "0.5"), preexec_fn=_ignore_sigxfsz
    )
    _wait_held(env, flags)
    # The disk is full from now on for this worker: no file it writes may grow past
    # what its database's write-ahead log holds now (its log file is far smaller).
    wal = Path(str(env.db_path) + "-wal")
    limit = wal.stat().st_size
    assert (env.tmp / "worker1.log").stat().st_size < limit // 4
    resource.prlimit(first.pid, resource.RLIMIT_FSIZE, (limit, limit))
    for flag in flags:
        flag.unlink()
    code = first.wait(timeout=120)
    log = env.worker_log(1)
    assert code != 0, log
    _check_first_log(log, f"database disk full: {env.db_path}", runs)
    for run_id in runs:
        assert env.run(run_id).status != RunStatus.COMPLETED
    _finish_elsewhere(env, runs)


@pytest.fixture
def cluster_env(pg_cluster: PrivateCluster, tmp_path: Path) -> Env:
    world = Env(tmp_path, pg_cluster.create_database("agentledger_store_failure"))
    return world


def _read_only(cluster: PrivateCluster, on: bool) -> None:
    """Make the whole cluster refuse writes (or take them again), for open sessions too."""
    with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
        conn.execute("SELECT pg_reload_conf()")


def test_burst_worker_on_a_read_only_postgres_releases_its_runs_when_it_is_back(
    pg_cluster: PrivateCluster, cluster_env: Env
) -> None:
    env = cluster_env
    try:
        runs, flags = _held_runs(env)
        # Each give-back is retried for the same window as the write before it: long
        # enough that the store is back while the worker still tries (the runs give
        # up within a fraction of it of each other, the test sees it in 50 ms).
        first = env.start_worker(lease=300, extra=("--burst", "--store-retry-seconds", "4"))
        _wait_held(env, flags)
        _read_only(pg_cluster, True)
        for flag in flags:
            flag.unlink()
        # Every run gave up its write; the store takes writes again while the worker
        # still tries to give the runs back.
        wait_for(
            lambda: all(f"run {r}: giving up" in env.worker_log(1) for r in runs),
            60,
            "every run to give up its journal write",
        )
        _read_only(pg_cluster, False)
        code = first.wait(timeout=120)
        log = env.worker_log(1)
        assert code != 0, log
        _check_first_log(log, "database is read-only: PostgreSQL", runs)
        for run_id in runs:
            run = env.run(run_id)
            assert f"run {run_id} released" in log, log
            assert run.status == RunStatus.QUEUED and run.lease_owner is None, run
        _finish_elsewhere(env, runs)
    finally:
        _read_only(pg_cluster, False)
        env.close()


def test_a_draining_worker_gives_its_runs_back_at_once_not_one_window_after_another(
    pg_cluster: PrivateCluster, cluster_env: Env
) -> None:
    # SIGTERM while the store refuses writes: the drain's releases each retry for
    # --store-retry-seconds. Tried one after another, a worker of 50 runs would stop
    # 50 windows later (killed first by any supervisor); tried together, one window.
    env = cluster_env
    try:
        runs, flags = _held_runs(env)
        first = env.start_worker(
            lease=300,
            extra=("-v", "--shutdown-grace", "0", "--store-retry-seconds", "2"),
        )
        _wait_held(env, flags)
        _read_only(pg_cluster, True)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
        lines = env.worker_log(1).splitlines()
        gave_up = next(i for i, line in enumerate(lines) if " not released" in line)
        for run_id in runs:
            tried = next(i for i, line in enumerate(lines) if f"release of run {run_id}" in line)
            assert tried < gave_up, "\n".join(lines)
        _read_only(pg_cluster, False)
        for flag in flags:
            flag.unlink()
        # Left to their leases: taken over at once, the worker being gone, and finished.
        _finish_elsewhere(env, runs)
    finally:
        _read_only(pg_cluster, False)
        env.close()


async def _append_event(url: str, run_id: str) -> None:
    store = open_store(url)
    await store.open()
    try:
        await store.append_event(run_id, "test.note", "test", {})
    finally:
        await store.close()


def _leases_expired(url: str, runs: list[str]) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT bool_and(lease_expires_at < EXTRACT(EPOCH FROM clock_timestamp())) "
            "FROM runs WHERE id = ANY(%s)",
            (runs,),
        ).fetchone()
    return bool(row and row[0])


def test_a_write_retried_past_its_lease_is_fenced_out_once_another_worker_took_the_run(
    pg_cluster: PrivateCluster, cluster_env: Env
) -> None:
    # The store refuses the first worker's writes (and heartbeats) for longer than its
    # lease: another worker, whose sessions still write, takes the runs and finishes
    # them. When the store takes the first worker's writes again, its resent write is
    # refused by the fence: it neither journals a step twice nor gives back (or
    # counts as given back) a run it no longer holds.
    env = cluster_env
    try:
        runs, flags = _held_runs(env)
        first = env.start_worker(lease=2, extra=("-v", "--store-retry-seconds", "600"))
        _wait_held(env, flags)
        _read_only(pg_cluster, True)
        for flag in flags:
            flag.unlink()
        wait_for(lambda: _leases_expired(env.url, runs), 60, "the first worker's leases to expire")
        writable = f"{env.url}?options=-c%20default_transaction_read_only%3Doff"
        _finish_elsewhere(env, runs, db=writable)
        # Its periodic work keeps meeting the cause: logged once all the same, repeats
        # at DEBUG. Here the audit seal (every second), given an event to seal.
        asyncio.run(_append_event(writable, runs[0]))
        wait_for(
            lambda: env.worker_log(1).count("audit sealing") >= 3,
            60,
            "the first worker's seals to fail a few times",
        )
        _read_only(pg_cluster, False)
        for run_id in runs:
            wait_for(
                lambda run_id=run_id: (
                    f"run {run_id} abandoned: lease lost" in env.worker_log(1)
                    or f"lease on run {run_id} " in env.worker_log(1)
                ),
                120,
                f"the first worker to learn it lost run {run_id}",
            )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 0, env.worker_log(1)
        log = env.worker_log(1)
        cause = "database is read-only: PostgreSQL"
        loud = [
            ln for ln in log.splitlines() if cause in ln and (" ERROR " in ln or " WARNING " in ln)
        ]
        assert len(loud) == 1, "\n".join(loud)
        for run_id in runs:
            assert f"run {run_id} released" not in log, log
            assert env.run(run_id).status == RunStatus.COMPLETED
        _done_once(env, runs)
    finally:
        _read_only(pg_cluster, False)
        env.close()


@pytest.mark.parametrize("phase", ["before_started", "after_effect"])
def test_a_worker_killed_while_it_retries_a_refused_write_loses_nothing_sqlite(
    env: Env, phase: str
) -> None:
    # Killed between the failed write and the release: its runs, still leased to it
    # for minutes, are taken at once by the next worker (the owner's process is gone)
    # and finished, no step executed twice. after_effect: the write's outcome is the
    # refused write; the next worker learns it without a second effect.
    runs, flags = _held_runs(env, phase)
    first = env.start_worker(
        lease=300, extra=("--store-retry-seconds", "600"), preexec_fn=_ignore_sigxfsz
    )
    _wait_held(env, flags)
    limit = Path(str(env.db_path) + "-wal").stat().st_size
    resource.prlimit(first.pid, resource.RLIMIT_FSIZE, (limit, limit))
    for flag in flags:
        flag.unlink()
    wait_for(lambda: "store failing: database disk full" in env.worker_log(1), 60, "a refusal")
    env.kill(first)
    _finish_elsewhere(env, runs)


@pytest.mark.parametrize("phase", ["before_started", "after_effect"])
def test_a_worker_killed_while_it_retries_a_refused_write_loses_nothing_postgres(
    pg_cluster: PrivateCluster, cluster_env: Env, phase: str
) -> None:
    env = cluster_env
    try:
        runs, flags = _held_runs(env, phase)
        first = env.start_worker(lease=300, extra=("--store-retry-seconds", "600"))
        _wait_held(env, flags)
        _read_only(pg_cluster, True)
        for flag in flags:
            flag.unlink()
        wait_for(lambda: "store failing: database is read-only" in env.worker_log(1), 60, "it")
        env.kill(first)
        _read_only(pg_cluster, False)
        _finish_elsewhere(env, runs)
    finally:
        _read_only(pg_cluster, False)
        env.close()


@pytest.mark.postgres
def test_a_lock_another_session_holds_on_postgres_is_waited_out_not_the_workers_end(
    pg_env: Env,
) -> None:
    # An operator's transaction (a VACUUM FULL, a migration, a forgotten psql session)
    # holds the runs table: the worker's writes and heartbeats run out their lock
    # timeout. Not the run's error nor the worker's: retried, and once the lock is
    # gone the runs finish. (Taken for a plain error, the first heartbeat to meet it
    # stopped the worker.)
    env = pg_env
    runs, flags = _held_runs(env)
    url = f"{env.url}?options=-c%20lock_timeout%3D200ms"
    first = env.start_worker(
        lease=300,
        db=url,
        extra=("--burst", "--store-retry-seconds", "600", "--heartbeat-seconds", "0.5"),
    )
    _wait_held(env, flags)
    holder = psycopg.connect(env.url)
    try:
        holder.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        for flag in flags:
            flag.unlink()
        wait_for(
            lambda: first.poll() is not None or "database statement timed out" in env.worker_log(1),
            60,
            "the worker to meet the lock",
        )
    finally:
        holder.rollback()
        holder.close()
    assert first.wait(timeout=120) == 0, env.worker_log(1)
    _done_once(env, runs)
