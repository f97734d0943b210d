"""Backup and restore of a live store (docs/architecture.md, "Backup and restore").

The world is real: a SQLite file or a PostgreSQL database, worker subprocesses, the
StayHub sandbox as the payment provider over HTTP. The story of each test: a run is held
in flight, a backup is taken while the worker runs, the run charges and completes, the
store is restored from the backup (older than the provider's ledger), a worker resumes
the run, and the provider holds exactly one charge, asked for exactly once.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentledger.records import RunStatus
from agentledger_examples.stayhub.sandbox import SandboxServer
from tests import dbutil
from tests.apps import ledger
from tests.cli.helpers import cli_here
from tests.engine.helpers import Env

APP = "tests.apps.restore_app:app"


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    with SandboxServer() as sb:
        os.environ["SANDBOX_URL"] = sb.url
        yield sb
    os.environ.pop("SANDBOX_URL", None)


def _submit(env: Env, flag: Path, **extra: object) -> str:
    from tests.apps.restore_app import app

    payload = {"check_in": "2026-12-20", "hold": {"item": "gate", "phase": "before",
               "flag": str(flag)}, **extra}  # fmt: skip
    return str(env._store(lambda s: app.submit(s, "restore_flow", payload)))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def _charges(sb: SandboxServer, run_id: str) -> list[dict[str, object]]:
    return [
        e
        for e in sb.ledger()
        if e["kind"] == "charge" and str(e["idempotency_key"]).startswith(run_id)
    ]


def _pg_tools() -> tuple[str, str] | None:
    dump, restore = shutil.which("pg_dump"), shutil.which("pg_restore")
    if dump and restore:
        return dump, restore
    if os.environ.get("CI"):
        pytest.fail("pg_dump and pg_restore must be on PATH in CI")
    pytest.skip("pg_dump/pg_restore not on PATH")
    return None


def _backup(env: Env, tmp: Path) -> Path:
    """Take a backup of the live store (a worker is running)."""
    target = tmp / "backup.db"
    if env.url.startswith("sqlite"):
        done = cli_here("backup", "--to", str(target), "--db", env.url)
        assert done.returncode == 0, done.stderr
        assert "backed up" in done.stdout
    else:
        tools = _pg_tools()
        assert tools is not None
        target = tmp / "backup.dump"
        subprocess.run([tools[0], "-Fc", "-f", str(target), env.url], check=True)
    return target


def _restore(env: Env, backup: Path) -> str:
    """Restore the backup (workers stopped); the URL of the restored store."""
    if env.url.startswith("sqlite"):
        done = cli_here("restore", "--from", str(backup), "--db", env.url)
        assert done.returncode == 0, done.stdout + done.stderr
        return env.url
    tools = _pg_tools()
    assert tools is not None
    url = dbutil.make_pg_database(migrated=False)
    env.on_close(lambda: dbutil.drop_pg_database(url))
    subprocess.run([tools[1], "--no-owner", "-d", url, str(backup)], check=True)
    done = cli_here("restore", "--db", url)
    assert done.returncode == 0, done.stdout + done.stderr
    return url


def test_back_up_charge_restore_resume_charges_once(
    backend_env: Env, sandbox: SandboxServer, tmp_path: Path
) -> None:
    env = backend_env
    flag = env.hold_flag("gate")
    run_id = _submit(env, flag)
    worker = env.start_worker(app=APP)
    env.wait_marker(flag)  # booked, held at the gate: in flight
    backup = _backup(env, tmp_path)
    flag.unlink()
    env.wait_status(run_id, RunStatus.COMPLETED)
    _stop(worker)
    assert len(_charges(sandbox, run_id)) == 1

    env.url = _restore(env, backup)  # older than the provider's ledger
    restored = env.run(run_id)
    assert restored.status == RunStatus.RUNNING  # in flight when the backup was taken
    assert restored.restored_at is not None

    env.start_worker(app=APP)
    env.wait_status(run_id, RunStatus.COMPLETED)
    charges = _charges(sandbox, run_id)
    assert len(charges) == 1, charges
    # Never sent again: the charge made after the backup was found by its status check.
    assert ledger.count_calls(env.ledger, kind="charge_post") == 1
    types = [e.type for e in env.events(run_id)]
    assert "tool.restored_check" in types


def test_a_keyless_write_after_a_restore_goes_to_a_person(
    env: Env, sandbox: SandboxServer, tmp_path: Path
) -> None:
    flag = env.hold_flag("gate")
    run_id = _submit(env, flag, keyless=True)
    worker = env.start_worker(app=APP)
    env.wait_marker(flag)
    backup = _backup(env, tmp_path)
    flag.unlink()
    env.wait_status(run_id, RunStatus.COMPLETED)
    _stop(worker)
    assert sum(env.effects("guarded").values()) == 1

    _restore(env, backup)
    env.start_worker(app=APP)
    run = env.wait_status(run_id, RunStatus.NEEDS_HUMAN)
    assert "restored from a backup" in (run.handover_reason or ""), run
    assert sum(env.effects("guarded").values()) == 1  # never called a second time
    assert "tool.restored_check" in [e.type for e in env.events(run_id)]

    # A person looks at the provider (it did happen), settles the write, resumes the run.
    step = next(s for s in env.journal(run_id) if s.name == "guarded_write")
    settled = cli_here("runs", "settle", run_id, str(step.step_no), "--applied", "--result",
                      '{"seen": "at the provider"}', "--reason", "made after the backup",
                      "--db", env.url)  # fmt: skip
    assert settled.returncode == 0, settled.stderr
    resumed = cli_here("runs", "resume", run_id, "--db", env.url)
    assert resumed.returncode == 0, resumed.stderr
    assert env.wait_status(run_id, RunStatus.COMPLETED).result == {
        "gift": {"seen": "at the provider"}
    }
    assert sum(env.effects("guarded").values()) == 1


def test_restore_refuses_while_a_worker_is_alive(
    env: Env, sandbox: SandboxServer, tmp_path: Path
) -> None:
    flag = env.hold_flag("gate")
    _submit(env, flag)
    worker = env.start_worker(app=APP)
    env.wait_marker(flag)
    backup = _backup(env, tmp_path)
    before = env.db_path.stat().st_ino
    done = cli_here("restore", "--from", str(backup), "--db", env.url)
    assert done.returncode != 0
    assert "worker" in done.stderr and "stop" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert env.db_path.stat().st_ino == before  # the live store is untouched
    assert worker.poll() is None
    flag.unlink()


def test_backup_refuses_bad_targets(env: Env, tmp_path: Path) -> None:
    assert cli_here("migrate", "--db", env.url).returncode == 0
    taken = tmp_path / "taken.db"
    taken.write_text("keep me")
    done = cli_here("backup", "--to", str(taken), "--db", env.url)
    assert done.returncode != 0 and "exists" in done.stderr, done.stderr
    assert taken.read_text() == "keep me"
    done = cli_here("backup", "--to", str(tmp_path / "x.dump"), "--db", "postgresql://h/db")
    assert done.returncode != 0 and "pg_dump" in done.stderr, done.stderr
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    done = cli_here("restore", "--from", str(junk), "--db", env.url)
    assert done.returncode != 0 and "not an agentledger backup" in done.stderr, done.stderr
    assert sqlite3.connect(env.db_path).execute("SELECT count(*) FROM runs").fetchone() == (0,)
    missing = cli_here("restore", "--from", str(tmp_path / "nope.db"), "--db", env.url)
    assert missing.returncode != 0 and "no backup" in missing.stderr, missing.stderr


def test_an_outbox_row_delivered_after_the_backup_is_not_delivered_blind(
    env: Env, tmp_path: Path
) -> None:
    """A finished run's pending outbox row, delivered after the backup: after the restore
    its key-less delivery is not sent again (a dead letter for a person)."""
    from tests.engine.helpers import APP as ENGINE_APP

    run_id = env.submit("notify_flow", {"msg": "hi"})
    worker = env.start_worker(app=ENGINE_APP, extra=("--burst", "--no-outbox"))
    assert worker.wait(timeout=60) == 0
    assert env.run(run_id).status == RunStatus.COMPLETED
    backup = _backup(env, tmp_path)  # the row is pending in the backup
    delivered = env.cli("outbox", "--app", ENGINE_APP, "--db", env.url)
    assert delivered.returncode == 0, delivered.stderr
    assert sum(env.effects("notify").values()) == 1

    _restore(env, backup)
    again = env.cli("outbox", "--app", ENGINE_APP, "--db", env.url)
    assert again.returncode == 0, again.stderr
    assert sum(env.effects("notify").values()) == 1  # never delivered a second time
    dead = env.outbox("dead")
    assert [i.run_id for i in dead] == [run_id]
    assert "unknown" in (dead[0].last_error or "")


@pytest.mark.long
def test_a_write_waiting_out_a_backoff_in_the_backup_is_checked_not_resent(
    backend_env: Env, tmp_path: Path
) -> None:
    """The backup holds a write parked after a 429 (nothing applied yet); after the
    backup it was sent again and applied. The restored run asks before sending."""
    from tests.engine.helpers import APP as ENGINE_APP

    env = backend_env
    args = {"item": "x", "mode": "rate_limited", "fail_first": 1, "retry_after": 3}
    run_id = env.submit("one_call", {"tool": "flaky_write", "args": args})
    worker = env.start_worker(app=ENGINE_APP)
    env.wait_status(run_id, RunStatus.WAITING)  # parked out the Retry-After
    backup = _backup(env, tmp_path)
    env.wait_status(run_id, RunStatus.COMPLETED)
    _stop(worker)
    key = env.journal(run_id)[0].idempotency_key

    env.url = _restore(env, backup)
    assert env.journal(run_id)[0].status == "unknown"
    env.start_worker(app=ENGINE_APP)
    env.wait_status(run_id, RunStatus.COMPLETED)
    assert env.effects("flaky") == {key: 1}
    # Two calls in all (the 429, then the one that applied): none after the restore.
    assert ledger.bump(f"flaky:{key}") - 1 == 2
