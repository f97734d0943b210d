"""A command loads only the modules it runs: a worker (started by a supervisor, by a
deploy, once per process) does not import the other commands, nor what they import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Run in a fresh interpreter: this process has imported everything the suite touched.
PROBE = """
import json, sys
from click.testing import CliRunner
from agentledger.cli._main import cli
result = CliRunner().invoke(cli, sys.argv[1:])
assert result.exit_code == 0, result.output
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("agentledger", "httpx")))))
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
