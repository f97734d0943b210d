"""Bad input to the CLI: one clean line on stderr, non-zero exit, no traceback."""

from __future__ import annotations

import json

import pytest

from agentledger.records import RunStatus
from tests.cli.helpers import cli_here
from tests.engine.helpers import Env

pytestmark = pytest.mark.slow

JOURNAL_FIELDS = {
    "step_no",
    "kind",
    "name",
    "status",
    "attempts",
    "idempotency_key",
    "duration_ms",
    "tokens",
    "cost_usd",
    "lease_epoch",
}


def _assert_clean_error(result: object, usage: bool = False) -> None:
    rc, err = result.returncode, result.stderr  # type: ignore[attr-defined]
    assert rc != 0
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    if usage:  # click's usage error: "Usage: ..." then "Error: ..."
        assert any(line.startswith("Error:") for line in lines), err
    else:
        assert len(lines) == 1 and lines[0].startswith("error:"), err


def test_bad_db_url_scheme(env: Env) -> None:
    _assert_clean_error(cli_here("runs", "list", "--db", "mysql://nobody/x"))


def test_corrupt_db_file(env: Env) -> None:
    bad = env.tmp / "corrupt.db"
    bad.write_bytes(b"this is not a database" * 100)
    _assert_clean_error(cli_here("runs", "list", "--db", f"sqlite:///{bad}"))


def test_db_folder_missing(env: Env) -> None:
    _assert_clean_error(
        cli_here("runs", "list", "--db", f"sqlite:///{env.tmp / 'no' / 'such' / 'dir' / 'x.db'}")
    )


def test_unknown_agent_name(env: Env) -> None:
    _assert_clean_error(cli_here("submit", "no_such_agent", "--db", env.url))
    _assert_clean_error(
        cli_here("submit", "no_such_agent", "--app", "tests.apps.engine_app:app", "--db", env.url)
    )


def test_invalid_input_json(env: Env) -> None:
    result = cli_here(
        "submit",
        "quick",
        "--input",
        "{not json",
        "--app",
        "tests.apps.engine_app:app",
        "--db",
        env.url,
    )
    _assert_clean_error(result, usage=True)


def test_show_unknown_run(env: Env) -> None:
    cli_here("migrate", "--db", env.url)
    _assert_clean_error(cli_here("runs", "show", "r-does-not-exist", "--db", env.url))


def test_json_output_parses_and_has_journal_fields(env: Env) -> None:
    run_id = env.submit("quick", {"n": 1})
    env.start_worker()
    env.wait_status(run_id, RunStatus.COMPLETED)
    listed = cli_here("runs", "list", "--json", "--db", env.url)
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == [run_id]
    shown = cli_here("runs", "show", run_id, "--json", "--db", env.url)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["run"]["status"] == RunStatus.COMPLETED
    assert len(data["steps"]) == 2
    for step in data["steps"]:
        assert set(step) >= JOURNAL_FIELDS, step


def test_locked_database(env: Env) -> None:
    import sqlite3

    env.submit("quick", {"n": 1})  # creates the schema
    holder = sqlite3.connect(env.db_path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        url = f"{env.url}?busy_timeout_ms=300"
        listed = env.cli("runs", "list", "--json", "--db", url)
        assert listed.returncode == 0, listed.stderr  # reads are not blocked (WAL)
        locked = env.cli(
            "submit",
            "quick",
            "--input",
            '{"n": 2}',
            "--version",  # queue it although no worker runs: this test is about the lock
            "1",
            "--app",
            "tests.apps.engine_app:app",
            "--db",
            url,
        )
        _assert_clean_error(locked)
        assert "locked" in locked.stderr
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r["input"] for r in json.loads(listed.stdout)] == [{"n": 1}]  # nothing lost
