"""A command loads only the modules it runs: a worker (started by a supervisor, by a
deploy, once per process) does not import the other commands, nor what they import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentledger.cli._main import BUILTIN, PACKAGED, builtin_command, packaged_command

# Run in a fresh interpreter: this process has imported everything the suite touched.
PROBE = """
import json, sys
from click.testing import CliRunner
from agentledger.cli._main import cli
PREFIXES = ("agentledger", "httpx", "fastapi", "pydantic_settings")
result = CliRunner().invoke(cli, sys.argv[1:])
assert result.exit_code == 0, result.output
print(json.dumps(sorted(m for m in sys.modules if m.startswith(PREFIXES))))
"""


def loaded_by(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_the_worker_command_imports_no_other_command() -> None:
    loaded = loaded_by("worker", "--help")
    assert "agentledger.cli._ops" in loaded
    others = {
        f"agentledger.cli.{m}"
        for m in (
            *("_audit", "_backup", "_chaos", "_docs", "_keys", "_memory", "_prune"),
            *("_resume", "_runs", "_serve", "_soak", "_stats", "_versions"),
        )
    }
    assert loaded & others == set()
    # What only other commands use: the chaos runner, the HTTP client, the examples.
    assert not {m for m in loaded if m.startswith(("agentledger._chaos", "httpx"))}
    assert not {m for m in loaded if m.startswith(("agentledger_examples", "agentledger_bench"))}


def test_a_group_loads_the_subcommands_defined_beside_other_commands() -> None:
    assert "agentledger.cli._resume" in loaded_by("runs", "--help")
    assert "agentledger.cli._resume" in loaded_by("outbox", "--help")


def test_commands_that_run_nothing_import_no_worker_and_no_engine(tmp_path: Path) -> None:
    """Only `worker` (and `serve`, for its inline workers) runs steps: a command that
    migrates, lists or decides does not load the worker and the engine, nor does
    `worker --help`."""
    db = f"sqlite:///{tmp_path / 'agentledger.db'}"
    running = {"agentledger.worker._worker", "agentledger.engine._runner"}
    for args in (
        ("migrate", "--db", db),
        ("runs", "list", "--db", db),
        ("runs", "list", "--stuck", "--db", db),
        ("approvals", "list", "--db", db),
        ("outbox", "dead", "--db", db),
        ("worker", "--help"),
    ):
        assert loaded_by(*args) & running == set(), args


# What a command that runs no step never needs: the gateway's hooks and the audit chain
# (cli/_features.py), the models, the environment's settings (pydantic-settings), the
# web framework.
FEATURES = ("agentledger.gateway", "agentledger.service", "agentledger.models")
HEAVY = (*FEATURES, "agentledger._envsettings", "pydantic_settings", "fastapi")


def _heavy(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m.startswith(HEAVY)}


def test_the_command_list_imports_no_command() -> None:
    """`agentledger --help` lists every command from the tables of cli/_main.py: it
    imports none of them, nor the store, the examples' sandbox app or the benchmarks."""
    loaded = loaded_by("--help")
    assert {m for m in loaded if m.startswith("agentledger.cli.")} == {
        "agentledger.cli._main",
        "agentledger.cli._guard",
    }
    assert not {m for m in loaded if m.startswith(("agentledger.store", "agentledger_"))}
    assert _heavy(loaded) == set()


def test_the_command_list_says_what_each_command_says_of_itself() -> None:
    """The tables' summaries are the first sentence of each command's own help."""
    for name, (_, _, summary) in BUILTIN.items():
        assert builtin_command(name).get_short_help_str(10_000) == summary, name
    for name, (_, _, _, summary) in PACKAGED.items():
        assert packaged_command(name).get_short_help_str(10_000) == summary, name


def test_commands_that_list_submit_or_decide_load_no_worker_feature(tmp_path: Path) -> None:
    """The gateway, the audit chain and the models are loaded by the commands that run
    steps or prune, not by the ones an operator or a script calls all day, nor by
    `worker --help`; the sandbox's `--faults` help shows its grammar without the
    sandbox's app."""
    db = f"sqlite:///{tmp_path / 'agentledger.db'}"
    assert _heavy(loaded_by("migrate", "--db", db)) == set()
    for args in (
        ("runs", "list", "--db", db),
        ("approvals", "list", "--db", db),
        ("submit", "--help"),
        ("worker", "--help"),
        ("sandbox", "--help"),
    ):
        assert _heavy(loaded_by(*args)) == set(), args


def test_a_worker_runs_with_the_gateway_and_the_audit_chain(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'agentledger.db'}"
    loaded = loaded_by("worker", "--app", "tests.apps.engine_app:app", "--db", db, "--burst")
    assert {"agentledger.gateway._engine", "agentledger.service._queries.audit"} <= loaded
    pruned = loaded_by("prune", "--older-than", "1d", "--db", db)
    assert "agentledger.service._queries.audit" in pruned
