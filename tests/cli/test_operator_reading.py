"""The operator reads a run: a failed run's error is its message (its traceback with
``-v``), a handed-over run opens with the operator's reason, and ``runs list`` says why
a failed run failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import cli_here, run_cli

APP = "tests.apps.engine_app:app"


@pytest.fixture(autouse=True)
def engine_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "ledger.db"))  # the apps' provider


def ran(tmp_path: Path, name: str, payload: object) -> tuple[str, str]:
    """Submit one run of ``name`` and work it off with a burst worker: (db url, run id)."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    submitted = cli_here("submit", name, "--app", APP, "--input", json.dumps(payload), "--db", url)
    assert submitted.returncode == 0, submitted.stderr
    worked = run_cli("worker", "--app", APP, "--burst", "--db", url)
    assert worked.returncode == 0, worked.stderr
    return url, submitted.stdout.strip()


def test_a_failed_run_shows_its_message_and_its_traceback_only_with_v(tmp_path: Path) -> None:
    url, run_id = ran(tmp_path, "one_call", {})  # KeyError: 'tool'
    shown = cli_here("runs", "show", run_id, "--db", url)
    assert shown.returncode == 0, shown.stderr
    assert "error: KeyError: 'tool'\n" in shown.stdout, shown.stdout
    assert "\\x0a" not in shown.stdout and "Traceback" not in shown.stdout, shown.stdout
    assert f"(traceback: agentledger runs show {run_id} --db {url} -v)" in shown.stdout

    verbose = cli_here("runs", "show", run_id, "-v", "--db", url)
    assert verbose.returncode == 0, verbose.stderr
    lines = verbose.stdout.splitlines()
    assert "error: KeyError: 'tool'" in lines, verbose.stdout
    start = next(i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line)
    assert any('File "' in line and "engine_app.py" in line for line in lines[start:])
    assert "\\x0a" not in verbose.stdout

    listed = cli_here("runs", "list", "--db", url)
    row = next(line for line in listed.stdout.splitlines() if run_id in line)
    assert "KeyError: 'tool'" in row, listed.stdout
    assert "Traceback" not in listed.stdout


def test_a_refused_run_lists_its_class_and_first_line(tmp_path: Path) -> None:
    url, run_id = ran(tmp_path, "scripted", {"turns": [{"refusal": "not this\nnor that"}]})
    listed = cli_here("runs", "list", "--db", url, "--json")
    (row,) = [r for r in json.loads(listed.stdout) if r["id"] == run_id]
    assert row["status"] == "failed"
    assert row["note"] == "refused: the model refused: not this", row


def test_a_handed_over_run_opens_with_the_operators_reason(tmp_path: Path) -> None:
    url, run_id = ran(tmp_path, "budget_steps", {"loop": ["read_tool", {"x": "1"}]})
    shown = cli_here("runs", "show", run_id, "--db", url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].endswith("needs_human"), lines
    assert lines[2].startswith("reason: "), lines  # after the header and its figures
    said = next(i for i, line in enumerate(lines) if "a member of our team" in line)
    assert lines[said].startswith("message to the user: "), lines
    assert said > 2


def test_runs_show_counts_an_operators_resume(tmp_path: Path) -> None:
    url, run_id = ran(tmp_path, "one_call", {})
    assert "resumes=0" in cli_here("runs", "show", run_id, "--db", url).stdout
    resumed = cli_here("runs", "resume", run_id, "--db", url)
    assert resumed.returncode == 0, resumed.stderr
    assert run_cli("worker", "--app", APP, "--burst", "--db", url).returncode == 0
    shown = cli_here("runs", "show", run_id, "--db", url)
    assert "resumes=1 (1 by an operator)" in shown.stdout.splitlines()[1], shown.stdout
    as_json = json.loads(cli_here("runs", "show", run_id, "--db", url, "--json").stdout)
    assert as_json["run"]["operator_resumes"] == 1


def test_an_outbox_step_shows_its_deliveries_not_att_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the table
    url, run_id = ran(tmp_path, "notify_flow", {"msg": "hi"})  # the worker delivers it
    row = [line for line in cli_here("runs", "show", run_id, "--db", url).stdout.splitlines()
           if " notify " in line]  # fmt: skip
    assert len(row) == 1 and " 1 delivered " in row[0], row
