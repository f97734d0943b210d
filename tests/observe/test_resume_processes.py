"""`runs settle` and `runs resume` as real CLI processes, killed at random points and
stopped inside their transaction, racing a real worker process: no write is ever sent
twice at the provider, and a killed command leaves the run as it found it or as it
would have left it (issue 19, second review, points 1 and 6).

The provider is the external ledger of tests/apps/ledger.py (its own SQLite file, shared
with the worker process); the worker runs tests/apps/engine_app.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentledger.records import RunStatus, StepStatus
from tests.engine.helpers import ROOT, Env, wait_for
from tests.observe.test_resume_attack import _waiting_on_a_lock


def _guarded_in_doubt(env: Env, n: int) -> list[str]:
    """``n`` runs of ``guarded_write`` (no provider keys, no status check) whose answer
    came after the tool's timeout: each applied once and went to ``needs_human``."""
    ids = [
        env.submit("one_call", {"tool": "guarded_write", "args": {"item": f"g{i}",
                                                                   "sleep_after": 1.0}})
        for i in range(n)
    ]  # fmt: skip
    for run_id in ids:
        env.wait_status(run_id, RunStatus.NEEDS_HUMAN, timeout=60)
        assert [s.status for s in env.journal(run_id)] == [StepStatus.UNKNOWN]
    return ids


def _cli(env: Env, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentledger.cli._main", *args, "--db", env.url],
        cwd=ROOT,
        env=env.child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _past_its_imports(proc: subprocess.Popen[str], give_up: float = 60.0) -> None:
    """Return once ``proc`` holds a socket or a database file open (its event loop or its
    store: its imports are done), or has ended. A kill during the imports tests nothing:
    the random points below are taken from here, so they land in the command's work
    however slowly the machine imports."""
    deadline = time.monotonic() + give_up
    fds = Path(f"/proc/{proc.pid}/fd")
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for fd in fds.iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:") or target.endswith(".db"):
                        return
        time.sleep(0.01)


def _kill_at_random(proc: subprocess.Popen[str], rng: random.Random, tries: int) -> None:
    """SIGSTOP at a random moment of its work (maybe inside its transaction), then
    SIGKILL: the command never gets to finish what it began (the window widens with
    each try, so one does get through on a slow machine)."""
    _past_its_imports(proc)
    time.sleep(rng.uniform(0.0, 0.4 * tries))  # a random point, not a timed assertion
    if proc.poll() is not None:
        proc.communicate(timeout=30)
        return
    proc.send_signal(signal.SIGSTOP)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)


def _settled(env: Env, run_id: str) -> int:
    return len([e for e in env.events(run_id) if e.type == "step.settled"])


@pytest.mark.long
def test_settle_and_resume_killed_at_random_points_never_send_twice(
    backend_env: Env,
) -> None:
    env, rng = backend_env, random.Random(19)
    env.start_worker(lease=2.0)
    # One run: each kill is a command process of its own, started again until one gets
    # through; a second run would only draw more points of the same two commands.
    ids = _guarded_in_doubt(env, 1)
    keys = {run_id: env.journal(run_id)[0].idempotency_key for run_id in ids}
    assert all(env.calls("guarded")[keys[r]] == 1 for r in ids)

    for run_id in ids:
        seen = [e for e in _ledger_effects(env) if e["key"] == keys[run_id]]
        assert len(seen) == 1
        args = ("runs", "settle", run_id, "1", "--applied", "--result", json.dumps(seen[0]),
                "--reason", "seen in the ledger", "--actor", "ops:kim")  # fmt: skip
        # Killed at random until one gets through; every kill leaves it all or nothing.
        tries = 0
        while env.journal(run_id)[0].status == StepStatus.UNKNOWN:
            tries += 1
            _kill_at_random(_cli(env, *args), rng, tries)
            step = env.journal(run_id)[0]
            assert _settled(env, run_id) == (step.status == StepStatus.SUCCEEDED)
            assert step.status in (StepStatus.UNKNOWN, StepStatus.SUCCEEDED)
        done = _cli(env, *args)  # the same decision again: a no-op, not a second record
        said = done.communicate(timeout=60)
        assert done.returncode == 0, said
        assert _settled(env, run_id) == 1

        # The worker races every resume: it claims the run the moment it is queued.
        tries = 0
        while env.run(run_id).status == RunStatus.NEEDS_HUMAN:
            tries += 1
            resume = _cli(env, "runs", "resume", run_id, "--reason", "settled")
            _kill_at_random(resume, rng, tries)
            journal = env.journal(run_id)
            assert [s.status for s in journal][:1] == [StepStatus.SUCCEEDED], journal
        run = env.wait_status(run_id, RunStatus.COMPLETED, timeout=60)
        assert run.result == seen[0]
        resumed = [e for e in env.events(run_id) if e.type == "run.resumed"]
        assert len(resumed) == 1
    # Never a second call at the provider, whatever was killed when.
    assert {k: env.calls("guarded")[k] for k in keys.values()} == dict.fromkeys(keys.values(), 1)


def _ledger_effects(env: Env) -> list[dict[str, Any]]:
    from tests.apps import ledger

    return ledger.effects(env.ledger, kind="guarded")


def test_a_resume_stopped_inside_its_transaction_then_killed_changes_nothing(
    backend_env: Env, backend: str
) -> None:
    """The resume has made all its writes but the last (its audit event waits on a lock
    another session holds); it is stopped there and killed. Its transaction never
    commits: the run is as it was, and the next resume goes through."""
    if backend != "postgres":
        pytest.skip("SQLite takes its write lock at BEGIN: nothing to wait on inside it")
    env = backend_env
    env.start_worker(lease=2.0)
    (run_id,) = _guarded_in_doubt(env, 1)
    key = env.journal(run_id)[0].idempotency_key
    (seen,) = [e for e in _ledger_effects(env) if e["key"] == key]
    settled = env.cli("runs", "settle", run_id, "1", "--applied", "--result", json.dumps(seen),
                      "--reason", "seen in the ledger", "--db", env.url)  # fmt: skip
    assert settled.returncode == 0, settled.stderr
    before = [(s.step_no, s.status) for s in env.journal(run_id)]
    with psycopg.connect(env.url) as holder:
        # Its last write (the run.resumed event) waits: every other write of it is done.
        holder.execute("LOCK TABLE events IN SHARE MODE")
        proc = _cli(env, "runs", "resume", run_id, "--reason", "settled")
        wait_for(lambda: _waiting_on_a_lock(env.url), 60, "the resume to wait inside its tx")
        proc.send_signal(signal.SIGSTOP)
        assert env.run(run_id).status == RunStatus.NEEDS_HUMAN  # not committed
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        holder.rollback()
    wait_for(lambda: not _waiting_on_a_lock(env.url) and _backends(env.url) == 0, 60,
             "the killed resume's session to end")  # fmt: skip
    assert env.run(run_id).status == RunStatus.NEEDS_HUMAN
    assert [s.step_no for s in env.journal(run_id)] == [n for n, _ in before]
    assert not [e for e in env.events(run_id) if e.type == "run.resumed"]
    done = env.cli("runs", "resume", run_id, "--reason", "settled", "--db", env.url)
    assert done.returncode == 0, done.stderr
    assert env.wait_status(run_id, RunStatus.COMPLETED, timeout=60).result == seen
    assert env.calls("guarded")[key] == 1


def _backends(url: str) -> int:
    """Sessions of the killed CLI still open (neither this check's nor the worker's)."""
    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_bulk_resume_reports_every_run_when_one_is_held_by_another_command(
    backend_env: Env, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runs resume --status needs_human` over: one run that can go, one whose row another
    command holds (a settle stopped inside its transaction), one refused (unknown, not
    settled). The held run must not stop the bulk, nor hide what it did: every run is in
    the output with what happened to it, and the command says it did not finish them all."""
    if backend != "postgres":
        pytest.skip("SQLite locks the whole file: no single run can be held")
    env = backend_env
    env.start_worker(lease=2.0)
    ready, held, unknown = _guarded_in_doubt(env, 3)
    for run_id in (ready, held):
        key = env.journal(run_id)[0].idempotency_key
        (seen,) = [e for e in _ledger_effects(env) if e["key"] == key]
        out = env.cli("runs", "settle", run_id, "1", "--applied", "--result", json.dumps(seen),
                      "--reason", "seen", "--db", env.url)  # fmt: skip
        assert out.returncode == 0, out.stderr
    with psycopg.connect(env.url) as holder:
        holder.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", (held,))
        with monkeypatch.context() as patch:
            # The command's sessions give up on the held row after a short lock_timeout
            # instead of the store's statement timeout: the store maps both to the same
            # error (a held row, StoreUnavailable), so the bulk meets what it meets in
            # production, sooner.
            patch.setenv("PGOPTIONS", "-c lock_timeout=2s")
            out = env.cli("runs", "resume", "--status", "needs_human", "--json", "--db", env.url,
                          timeout=300)  # fmt: skip
        holder.rollback()
    assert out.returncode == 1, (out.stdout, out.stderr)
    report = {r["run_id"]: r for r in json.loads(out.stdout)}
    assert set(report) == {ready, held, unknown}, out.stdout
    assert report[ready]["refused"] == [] and report[ready]["from_step"] == 2
    assert "runs settle" in report[unknown].get("refused", ""), report
    assert "look again" in report[held]["error"], report[held]
    env.wait_status(ready, RunStatus.COMPLETED, timeout=60)
    assert env.run(held).status == RunStatus.NEEDS_HUMAN  # untouched: run the bulk again
    assert env.run(unknown).status == RunStatus.NEEDS_HUMAN
