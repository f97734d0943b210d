"""Resuming a partly compensated run (one refund applied, one declined) as real CLI
processes: two resumes at once archive the declined refund once and record one resume;
a resume killed inside its transaction, after it deleted the declined refund, changes
nothing (issue 22, review).

The run is made in process (tests/observe/test_resume_partial_compensation_attack.py's
booking); the provider is the external ledger of tests/apps/ledger.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from agentledger.records import RunStatus, StepStatus
from tests.engine.helpers import ROOT, wait_for
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_resume_attack import _waiting_on_a_lock
from tests.observe.test_resume_partial_compensation_attack import DECLINE, _app, _compensated
from tests.observe.test_resume_settle import money_taken


def _cli(url: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "agentledger.cli._main", *args, "--db", url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _locks_waited(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def _opened(proc: subprocess.Popen[str], path: Path) -> bool:
    """Whether the process has the SQLite file open (it is at its BEGIN, or past it)."""
    try:
        fds = os.listdir(f"/proc/{proc.pid}/fd")
    except FileNotFoundError:
        return proc.poll() is not None
    for fd in fds:
        try:
            if os.readlink(f"/proc/{proc.pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    DECLINE.clear()
    return Harness(tmp_path, _app(), url=store_url)


def test_two_resumes_at_once_archive_the_declined_refund_once(
    harness: Harness, backend: str
) -> None:
    """Both resumes are in flight before either commits (PostgreSQL: both wait on locks
    another session holds; SQLite: both wait for the write lock another connection holds):
    one resumes, the other is refused, the declined refund is archived once, and the
    resumed run finishes its compensation with each refund applied once."""
    h = harness

    async def seed() -> tuple[str, dict[int, str | None]]:
        async with h:
            run_id = await _compensated(h, {"refund_fee"})
            return run_id, {s.step_no: s.idempotency_key for s in await h.journal(run_id)}

    run_id, keys = asyncio.run(seed())
    args = ("runs", "resume", run_id, "--reason", "fee account unlocked", "--actor")
    if backend == "postgres":
        with psycopg.connect(h.url) as holder:
            # The first resume waits on its audit event (its deletes done), the second on
            # the run's row the first holds.
            holder.execute("LOCK TABLE events IN SHARE MODE")
            first = _cli(h.url, *args, "ops:amy")
            wait_for(lambda: _locks_waited(h.url) >= 1, 60, "the first resume to wait")
            second = _cli(h.url, *args, "ops:bob")
            wait_for(lambda: _locks_waited(h.url) >= 2, 60, "the second resume to wait")
            holder.rollback()
    else:
        holder = sqlite3.connect(h.path, isolation_level=None, timeout=30)
        holder.execute("BEGIN IMMEDIATE")
        first = _cli(h.url, *args, "ops:amy")
        second = _cli(h.url, *args, "ops:bob")
        wait_for(lambda: _opened(first, h.path) and _opened(second, h.path), 60,
                 "both resumes to open the store")  # fmt: skip
        holder.execute("ROLLBACK")
        holder.close()
    outs = [p.communicate(timeout=120) for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert codes == [0, 1], outs
    refused = outs[[first.returncode, second.returncode].index(1)]
    assert "queued" in refused[0] + refused[1] or "meanwhile" in refused[0] + refused[1], refused

    async def finish() -> None:
        async with h:
            resumed = [e for e in await h.events(run_id) if e.type == "run.resumed"]
            assert len(resumed) == 1, resumed
            # Kept and marked for its status check, once.
            assert resumed[0].data["archived_steps"] == []
            assert resumed[0].data["compensations_checked"] == [5]
            assert [s.step_no for s in await h.journal(run_id)] == [1, 2, 3, 4, 5, 6]
            DECLINE.clear()
            run = await h.drive(run_id)
            assert run.status == RunStatus.FAILED, run
            journal = {s.step_no: s for s in await h.journal(run_id)}
            assert journal[5].status == StepStatus.SUCCEEDED
            assert journal[5].idempotency_key == keys[5]

    asyncio.run(finish())
    assert money_taken("charge", "refund") == 0


def test_a_resume_killed_after_deleting_the_declined_refund_changes_nothing(
    harness: Harness, backend: str
) -> None:
    """The resume has deleted the declined refund (its last write, the audit event, waits
    on a lock another session holds); it is stopped there and killed. Its transaction
    never commits: the refund's row is still there, the run still needs a human; the
    next resume goes through."""
    if backend != "postgres":
        pytest.skip("SQLite takes its write lock at BEGIN: nothing to wait on inside it")
    h = harness

    async def seed() -> str:
        async with h:
            return await _compensated(h, {"refund_fee"})

    run_id = asyncio.run(seed())
    with psycopg.connect(h.url) as holder:
        holder.execute("LOCK TABLE events IN SHARE MODE")
        proc = _cli(h.url, "runs", "resume", run_id, "--reason", "retry")
        wait_for(lambda: _waiting_on_a_lock(h.url), 60, "the resume to wait inside its tx")
        proc.send_signal(signal.SIGSTOP)
        with psycopg.connect(h.url, autocommit=True) as look:
            # Its deletes are made but not committed: another session still sees the row.
            rows = look.execute(
                "SELECT step_no FROM steps WHERE run_id = %s ORDER BY step_no", (run_id,)
            ).fetchall()
            assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        holder.rollback()

    def gone() -> bool:
        with psycopg.connect(h.url, autocommit=True) as pg:
            row = pg.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction'"
            ).fetchone()
        return not _waiting_on_a_lock(h.url) and bool(row) and int(row[0]) == 0

    wait_for(gone, 60, "the killed resume's session to end")

    async def after() -> None:
        async with h:
            assert (await h.run(run_id)).status == RunStatus.NEEDS_HUMAN
            journal = await h.journal(run_id)
            assert [(s.step_no, s.status) for s in journal][4] == (5, StepStatus.FAILED)
            assert not [e for e in await h.events(run_id) if e.type == "run.resumed"]

    asyncio.run(after())
    done = _cli(h.url, "runs", "resume", run_id, "--reason", "retry")
    out = done.communicate(timeout=120)
    assert done.returncode == 0, out

    async def finish() -> None:
        async with h:
            DECLINE.clear()
            assert (await h.drive(run_id)).status == RunStatus.FAILED

    asyncio.run(finish())
    assert money_taken("charge", "refund") == 0


def test_a_bulk_resume_finishes_a_partly_compensated_run_and_counts_the_refused(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runs resume --status needs_human` over a partly compensated booking (resumable:
    its declined refund is called again) and a payout whose outcome is unknown with no
    status check (refused until settled): the dry run and the resume each name the
    declined refund's key, the resume exits 1 (one run refused) with the counts, and the
    booking is resumed."""
    from click.testing import CliRunner

    from agentledger.cli._main import cli
    from tests.observe.test_resume_settle import FAULT, _unknown_payout, settle_app

    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    DECLINE.clear()
    FAULT.update(payout=None, confirm=None)
    booking, payouts = (
        Harness(tmp_path, _app(), url=store_url),
        Harness(tmp_path, settle_app(), url=store_url),
    )

    async def seed() -> tuple[str, str, str]:
        async with booking:
            partial = await _compensated(booking, {"refund_fee"})
            key = {s.step_no: s.idempotency_key for s in await booking.journal(partial)}[5]
        async with payouts:
            unknown, _ = await _unknown_payout(payouts, "before_commit")
        assert key is not None
        return partial, unknown, key

    partial, unknown, key = asyncio.run(seed())
    runner = CliRunner()
    base = ["runs", "resume", "--status", "needs_human", "--db", store_url]
    checked = "failed (it may have applied: asked first)"
    out = runner.invoke(cli, [*base, "--dry-run"])
    assert out.exit_code == 0, out.output
    assert f"would resume {partial} (needs_human) from step 7" in out.output, out.output
    assert f"5 refund_fee: {checked}, key {key} -> status-checked" in out.output
    assert out.output.splitlines()[-1].startswith("dry run: would resume 1, would refuse 1")
    out = runner.invoke(cli, [*base, "--reason", "fee account unlocked"])
    assert out.exit_code == 1, out.output
    assert f"resumed {partial} (needs_human) from step 7" in out.output, out.output
    assert f"5 refund_fee: {checked}, key {key} -> status-checked" in out.output
    assert f"refused {unknown}: " in out.output
    assert out.output.splitlines()[-1].startswith("resumed 1, refused 1"), out.output

    async def finish() -> None:
        async with booking:
            DECLINE.clear()
            run = await booking.drive(partial)
            assert run.status == RunStatus.FAILED, run

    asyncio.run(finish())
    assert money_taken("charge", "refund") == 0
