"""Upgrades with runs in flight (docs/architecture.md, "Upgrades with runs in flight").

The world is real: a SQLite file or a PostgreSQL database and worker subprocesses. The
next release is this code plus one migration, installed beside it (a copy of the
package with the migration added); the previous release is this code. Workers of the
previous release serve runs parked for approval, waiting to retry, inside a step, and
an outbox delivery; `agentledger migrate` of the next release upgrades the schema while
they serve; they keep working; workers of the next release take over; every run
completes with each write called exactly once. An offline migration is refused while a
worker serves, with the reason, and applied once the workers stop.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

import agentledger
from agentledger.records import RunStatus
from agentledger.store._sqlite import SQLiteDialect
from tests.apps import upgrade_app
from tests.cli.helpers import cli_here
from tests.engine.helpers import Env, parse_json, wait_for
from tests.store.test_migration_rules import violations

APP = "tests.apps.upgrade_app:app"
assert upgrade_app.app  # its workflows are the engine app's (Env.submit) once imported

EXPAND = """-- The next release: new columns, a new table, an index, a backfill.
ALTER TABLE runs ADD COLUMN upgrade_hint TEXT;
ALTER TABLE steps ADD COLUMN upgrade_note TEXT;
ALTER TABLE outbox ADD COLUMN upgrade_tries INTEGER NOT NULL DEFAULT 0;
CREATE TABLE upgrade_notes (run_id TEXT PRIMARY KEY, note TEXT);
CREATE INDEX runs_upgrade_hint ON runs (upgrade_hint);
UPDATE runs SET upgrade_hint = status
"""

OFFLINE = """-- The next release, offline.
-- offline: rewrites every run row
CREATE TABLE upgrade_offline (x TEXT)
"""


def _next_release(tmp: Path, script: str) -> tuple[Path, str]:
    """This package plus migration ``script`` as the next number, installed in
    ``tmp``; the path to put first on PYTHONPATH and the migration's file name."""
    tree = tmp / "next-release"
    package = Path(agentledger.__file__).parent
    shutil.copytree(package, tree / "agentledger", ignore=shutil.ignore_patterns("__pycache__"))
    latest = max(v for v, _ in SQLiteDialect("sqlite:///x.db").migrations())
    name = f"{latest + 1:04d}_upgrade_probe.sql"
    for dialect in ("sqlite", "postgres"):
        (tree / "agentledger" / "store" / "migrations" / dialect / name).write_text(script)
    return tree, name.removesuffix(".sql")


class Release:
    """Commands and workers of the next release (its tree first on the path)."""

    def __init__(self, env: Env, tree: Path) -> None:
        self.env, self.tree = env, tree

    def _as_next(self) -> None:
        base = Env.child_env

        def child_env(env: Env = self.env) -> dict[str, str]:
            found = base(env)
            found["PYTHONPATH"] = f"{self.tree}:{found['PYTHONPATH']}"
            return found

        self.env.child_env = child_env  # type: ignore[method-assign]

    def _as_previous(self) -> None:
        del self.env.child_env

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        self._as_next()
        try:
            return self.env.cli(*args, "--db", self.env.url)
        finally:
            self._as_previous()

    def start_worker(self) -> subprocess.Popen[bytes]:
        self._as_next()
        try:
            return self.env.start_worker(app=APP, extra=("--shutdown-grace", "0.5"))
        finally:
            self._as_previous()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.long
def test_runs_in_flight_survive_an_online_upgrade(backend_env: Env, tmp_path: Path) -> None:
    env = backend_env
    tree, migration = _next_release(tmp_path, EXPAND)
    assert violations(EXPAND, [], code="") == []  # an expand migration by the rule
    nxt = Release(env, tree)

    # Runs of the previous release, each in flight in its own way.
    held = env.hold_flag("step")
    inside = env.submit("five_writes", {"hold": {"item": "i3", "phase": "before_started",
                                                 "flag": str(held), "once": True}})  # fmt: skip
    approval = env.submit("scripted", {"approve": ["keyed_write"], "turns": [
        {"calls": [["keyed_write", {"item": "approved"}]]}, {"text": "$echo"}]})  # fmt: skip
    retrying = env.submit("one_call", {"tool": "flaky_write", "args": {
        "item": "r", "mode": "rate_limited", "fail_first": 1, "retry_after": 2.0}})  # fmt: skip
    outbox_flag = env.hold_flag("outbox")
    delivering = env.submit("held_notify_flow", {"msg": "hi", "flag": str(outbox_flag)})
    old = env.start_worker(app=APP, extra=("--shutdown-grace", "0.5"))
    env.wait_marker(held)
    env.wait_status(approval, RunStatus.WAITING)
    env.wait_status(delivering, RunStatus.COMPLETED)
    env.wait_marker(outbox_flag)  # the outbox row is claimed, its delivery held
    wait_for(lambda: env.calls("flaky"), what="the first, failed attempt")

    # The deploy pipeline asks, then migrates while the previous release serves.
    check = nxt.cli("migrate", "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert migration in check.stderr and "online" in check.stderr
    status = nxt.cli("migrate", "--status")
    assert f"{migration.split('_', 1)[1]}" in status.stdout and "pending, online" in status.stdout
    done = nxt.cli("migrate")
    assert done.returncode == 0, done.stderr
    assert "applied 1" in done.stdout
    assert nxt.cli("migrate", "--check").returncode == 0
    # The previous release sees a current schema, and a migration of a newer release.
    assert env.cli("migrate", "--check", "--db", env.url).returncode == 0
    assert "by a newer release" in env.cli("migrate", "--status", "--db", env.url).stdout

    # The previous release's worker keeps working on the new schema.
    outbox_flag.unlink()
    quick = env.submit("quick", {"n": 1})
    env.wait_status(quick, RunStatus.COMPLETED)
    wait_for(lambda: env.effects("held_notify"), what="the held delivery")
    assert old.poll() is None

    # The next release's workers take over; the previous release's stop.
    nxt.start_worker()
    _stop(old)  # gives back the run held inside its step
    (pending,) = env.approvals(approval)
    decided = nxt.cli("approvals", "approve", pending.id, "--by", "alice")
    assert decided.returncode == 0, decided.stderr
    for run_id in (inside, approval, retrying, delivering, quick):
        env.wait_status(run_id, RunStatus.COMPLETED)

    # Every write exactly once: called once per key, applied once per key.
    keyed = env.calls("keyed")
    assert len(keyed) == 5 + 1 + 1 and set(keyed.values()) == {1}, keyed
    assert set(env.effects("keyed").values()) == {1}
    assert list(env.effects("flaky").values()) == [1]
    assert list(env.calls("held_notify").values()) == [1]
    assert env.outbox("delivered") and not env.outbox("pending")


@pytest.mark.long
def test_an_offline_migration_waits_for_the_workers_to_stop(
    backend_env: Env, tmp_path: Path
) -> None:
    env = backend_env
    tree, migration = _next_release(tmp_path, OFFLINE)
    nxt = Release(env, tree)
    old = env.start_worker(app=APP, extra=("--shutdown-grace", "0.5"))
    run_id = env.submit("quick", {"n": 1})
    env.wait_status(run_id, RunStatus.COMPLETED)

    check = nxt.cli("migrate", "--check")
    assert check.returncode == 3, check.stdout + check.stderr
    assert migration in check.stderr and "rewrites every run row" in check.stderr
    assert "pending, offline: rewrites every run row" in nxt.cli("migrate", "--status").stdout

    refused = nxt.cli("migrate")
    assert refused.returncode != 0
    assert "offline" in refused.stderr and "live worker" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert nxt.cli("migrate", "--check").returncode == 3  # nothing applied
    # A worker of the next release does not start beside it either: it says why.
    new = nxt.start_worker()
    assert new.wait(timeout=30) != 0
    assert "offline" in env.worker_log(2), env.worker_log(2)
    assert old.poll() is None

    _stop(old)
    done = nxt.cli("migrate")
    assert done.returncode == 0 and "applied 1" in done.stdout, done.stdout + done.stderr
    assert nxt.cli("migrate", "--check").returncode == 0
    nxt.start_worker()
    second = env.submit("quick", {"n": 2})
    env.wait_status(second, RunStatus.COMPLETED)


def test_migrate_status_and_check_on_a_new_and_a_current_store(tmp_path: Path) -> None:
    env = Env(tmp_path)  # not the `env` fixture: its database file is made in advance
    missing = cli_here("migrate", "--status", "--db", env.url)
    assert missing.returncode == 2 and "no database" in missing.stderr
    env.db_path.touch()  # an empty file: no schema yet
    empty = cli_here("migrate", "--check", "--db", env.url)
    assert empty.returncode == 1 and "no agentledger schema" in empty.stderr, empty.stderr
    listed = cli_here("migrate", "--status", "--db", env.url).stdout.splitlines()
    assert listed[0].split()[:3] == ["0001", "initial", "pending,"]
    assert cli_here("migrate", "--db", env.url).returncode == 0
    found = parse_json(cli_here("migrate", "--status", "--json", "--db", env.url).stdout)
    versions = [v for v, _ in SQLiteDialect("sqlite:///x.db").migrations()]
    assert [m["version"] for m in found] == versions
    assert all(m["applied_at"] and m["known"] and m["offline"] is None for m in found)
    current = cli_here("migrate", "--check", "--db", env.url)
    assert current.returncode == 0 and f"version {versions[-1]}" in current.stdout
