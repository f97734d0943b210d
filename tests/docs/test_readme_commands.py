"""The README's two commands are the set-up: CI runs the test command exactly, the
Makefile installs the same, and together they install every installable of the
repository (the runtime, examples/ and bench/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def two_commands() -> tuple[str, str]:
    """(the demo command, the test command) of the README's "Two commands" section."""
    section = ROOT.joinpath("README.md").read_text().split("## Two commands", 1)[1]
    section = section.split("\n## ", 1)[0]
    commands = [line.strip() for line in section.splitlines() if line.startswith("    ")]
    assert len(commands) == 2, commands
    demo, test = commands
    assert demo.endswith("&& agentledger demo"), demo
    assert test.endswith("&& pytest"), test
    return demo, test


def test_ci_runs_the_readme_test_command_exactly() -> None:
    _, test = two_commands()
    lines = [line.strip() for line in ROOT.joinpath(".ci", "run").read_text().splitlines()]
    assert test in lines, f"{test!r} is not a line of .ci/run"


def test_make_install_installs_what_the_test_command_does() -> None:
    _, test = two_commands()
    makefile = ROOT.joinpath("Makefile").read_text()
    install = re.search(r"^install:\n\t(.+)$", makefile, re.M)
    assert install is not None
    assert install.group(1).strip() == test.split("&&")[0].strip()


def test_the_commands_install_every_installable() -> None:
    demo, test = two_commands()
    projects = sorted(p.parent.name for p in ROOT.glob("*/pyproject.toml"))
    assert projects == ["bench", "examples"], projects
    for name in projects:
        assert f"-e ./{name}" in test, (name, test)
    assert "-e ./examples" in demo  # the demo is an example
