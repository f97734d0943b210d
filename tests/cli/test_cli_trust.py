"""What the CLI shows and accepts: untrusted text stays text, bad input is refused
before anything is written, ids are whole, submit routes to a version someone runs."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
from typing import Any

import pytest

from agentledger.records import RunStatus
from agentledger.store import NewRun
from tests.cli.helpers import cli_here
from tests.engine.helpers import APP, APP_V2, ROOT, Env, wait_for

pytestmark = pytest.mark.slow


def _clean_error(result: Any, *needles: str) -> str:
    assert result.returncode != 0, result
    err = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1]
    assert last.startswith(("error:", "Error:")), err
    for needle in needles:
        assert needle in last, err
    return last


def _runs(env: Env) -> list[dict[str, Any]]:
    listed = cli_here("runs", "list", "--json", "--db", env.url)
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout, parse_constant=_strict))


def _strict(name: str) -> Any:
    raise AssertionError(f"invalid JSON constant {name} in --json output")


# submit routing ------------------------------------------------------------------------


def _live_targets(env: Env) -> set[str]:
    workers = env._store(lambda s: s.list_workers(live_within=60))
    return {t for w in workers for t in w.targets}


def test_plain_submit_routes_to_the_newest_version_a_live_worker_has(env: Env) -> None:
    cli_here("migrate", "--db", env.url)
    refused = cli_here("submit", "versioned", "--db", env.url)  # nothing registered yet
    _clean_error(refused, "versioned")
    env.start_worker(app=APP)
    canary = env.start_worker(app=APP_V2)
    wait_for(lambda: {"versioned@1", "versioned@2"} <= _live_targets(env), what="both workers")
    first = cli_here("submit", "versioned", "--db", env.url)
    assert first.returncode == 0, first.stderr
    assert env.wait_status(first.stdout.strip(), RunStatus.COMPLETED).version == "2"
    canary.send_signal(signal.SIGTERM)  # the v2 canary stops
    assert canary.wait(timeout=30) == 0
    second = cli_here("submit", "versioned", "--db", env.url)
    assert second.returncode == 0, second.stderr
    run = env.wait_status(second.stdout.strip(), RunStatus.COMPLETED)
    assert run.version == "1"


def test_plain_submit_with_no_live_worker_is_refused_and_writes_nothing(env: Env) -> None:
    worker = env.start_worker(app=APP)
    wait_for(lambda: "versioned@1" in _live_targets(env), what="the worker")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    refused = cli_here("submit", "versioned", "--db", env.url)
    last = _clean_error(refused, "no live worker", "--version")
    assert "agentledger worker" in last
    assert _runs(env) == []
    # --app names the code to run: its newest version is queued for the next worker.
    named = cli_here("submit", "versioned", "--app", APP, "--db", env.url)
    assert named.returncode == 0, named.stderr
    assert "no live worker has versioned@1" in named.stderr
    cli_here("runs", "cancel", named.stdout.strip(), "--db", env.url)
    assert [r["status"] for r in _runs(env)] == ["cancelled"]
    # Explicitly versioned: queued anyway, with a note on stderr.
    queued = cli_here("submit", "versioned", "--version", "1", "--db", env.url)
    assert queued.returncode == 0, queued.stderr
    assert "no live worker has versioned@1" in queued.stderr
    assert [r["version"] for r in _runs(env)] == ["1", "1"]


# bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[" * 990 + "]" * 990, "nested"),
        ("[" * 50_000 + "]" * 50_000, "nested"),
        ('{"amount": NaN}', "NaN"),
        ('{"amount": Infinity}', "Infinity"),
        ('{"amount": -Infinity}', "Infinity"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(env: Env, text: str, needle: str) -> None:
    cli_here("migrate", "--db", env.url)
    result = cli_here(
        "submit", "quick", "--input", text, "--version", "1", "--app", APP, "--db", env.url
    )
    _clean_error(result, needle)
    assert _runs(env) == []


@pytest.mark.parametrize("option", ["--user", "--tenant"])
def test_invalid_utf8_in_an_option_is_named_not_blamed_on_the_database(
    env: Env, option: str
) -> None:
    cli_here("migrate", "--db", env.url)
    argv = [sys.executable.encode(), b"-m", b"agentledger.cli._main", b"submit", b"quick",
            b"--input", b'{"n": 1}', b"--version", b"1", b"--app", APP.encode(),
            option.encode(), b"bad\xff\xfeuser", b"--db", env.url.encode()]  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, env=env.child_env(), capture_output=True, check=False)
    last = _clean_error(result, option, "UTF-8")
    assert "SQLite" not in last
    assert _runs(env) == []


def test_json_output_stays_valid_json_for_old_rows_holding_nan(env: Env) -> None:
    # The store refuses NaN today; a row written before that holds it as JSON text.
    env._store(lambda s: s.create_run(NewRun(kind="workflow", name="quick", version="1", input={})))
    with sqlite3.connect(env.db_path) as conn:
        conn.execute("""UPDATE runs SET input = '{"n": NaN}'""")
    (run,) = _runs(env)
    assert run["input"] == {"n": "NaN"}


# untrusted text ---------------------------------------------------------------------------


def test_model_controlled_text_is_shown_literally(env: Env) -> None:
    hidden = "\x1b[8mto the attacker's account\x1b[0m"
    markup_run = env.submit(
        "scripted", {"turns": [{"calls": [["[/bold]", {}]]}, {"text": "[red]done"}]}
    )
    approval_run = env.submit(
        "scripted",
        {"turns": [{"calls": [["keyed_write", {"item": hidden}]]}], "approve": ["keyed_write"]},
    )
    env.start_worker()
    env.wait_status(markup_run, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_HUMAN)
    env.wait_status(approval_run, RunStatus.WAITING)
    for width in ("80", "200"):
        shown = _cli_at(env, width, "runs", "show", markup_run, "--db", env.url)
        assert shown.returncode == 0, shown.stderr
        assert "[/bold]" in shown.stdout
        assert "\x1b" not in shown.stdout
    approvals = _cli_at(env, "200", "approvals", "list", "--db", env.url)
    assert approvals.returncode == 0, approvals.stderr
    assert "\x1b" not in approvals.stdout
    # Spelled out (JSON's \u001b inside the arguments), so the approver sees all of it.
    assert re.search(r"\\(x1b|u001b)\[8mto the attacker's account", approvals.stdout), (
        approvals.stdout
    )
    listed = _cli_at(env, "80", "runs", "list", "--db", env.url)
    assert "\x1b" not in listed.stdout


def _cli_at(env: Env, columns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli_here(*args, env={"COLUMNS": columns})


# whole ids at 80 columns -----------------------------------------------------------------


def test_ids_are_never_cut_at_80_columns_or_when_piped(env: Env) -> None:
    ids = [env.submit("quick", {"n": n}) for n in range(2)]
    env.start_worker()
    for run_id in ids:
        env.wait_status(run_id, RunStatus.COMPLETED)
    for columns in ("80", None):
        args = ("runs", "list", "--db", env.url)
        listed = _cli_at(env, columns, *args) if columns else cli_here(*args)
        assert listed.returncode == 0, listed.stderr
        assert "…" not in listed.stdout
        for run_id in ids:
            assert run_id in listed.stdout
    shown = _cli_at(env, "80", "runs", "show", ids[0], "--db", env.url)
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout
    assert all(len(line) <= 80 for line in shown.stdout.splitlines()), shown.stdout
    for step in env.journal(ids[0]):
        if step.idempotency_key:
            assert step.idempotency_key in shown.stdout
    owner = next(e.actor for e in env.events(ids[0]) if e.type == "run.claimed")
    assert owner in shown.stdout


# cancel -------------------------------------------------------------------------------


def test_runs_cancel_says_what_happened(env: Env) -> None:
    queued = env.submit("quick", {"n": 1})
    first = cli_here("runs", "cancel", queued, "--db", env.url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"{queued} cancelled now"
    again = cli_here("runs", "cancel", queued, "--db", env.url)
    assert again.stdout.strip() == f"{queued} is already cancelled; nothing to cancel"
    done = env.submit("quick", {"n": 2})
    env.start_worker()
    env.wait_status(done, RunStatus.COMPLETED)
    late = cli_here("runs", "cancel", done, "--db", env.url)
    assert late.returncode == 0, late.stderr
    assert late.stdout.strip() == f"{done} is already completed; nothing to cancel"
    assert env.run(done).status == RunStatus.COMPLETED
    _clean_error(cli_here("runs", "cancel", "r-no-such-run", "--db", env.url), "no run")


# read-only commands never create a database ---------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("runs", "list"),
        ("runs", "show", "r-x"),
        ("runs", "cancel", "r-x"),
        ("approvals", "list"),
        ("approvals", "approve", "a-x", "--by", "ops"),
        ("outbox", "dead"),
    ],
)
def test_read_commands_do_not_create_a_database(env: Env, args: tuple[str, ...]) -> None:
    typo = env.tmp / "typo.db"
    result = cli_here(*args, "--db", f"sqlite:///{typo}")
    _clean_error(result, "no database at", "agentledger migrate")
    assert not typo.exists()


def test_a_db_without_a_scheme_shows_the_right_form(env: Env) -> None:
    result = cli_here("runs", "list", "--db", "runs.db", cwd=ROOT)
    _clean_error(result, "sqlite:///runs.db")
    assert not (ROOT / "runs.db").exists()
