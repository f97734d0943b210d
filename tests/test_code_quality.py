"""The code stays lint-clean (checked here, as the suite runs) and type-checked (checked by
CI before the suite, ``make typecheck``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The runtime, the tests, and the installables beside the runtime (README, Two commands).
CODE = ("src", "tests", "examples", "bench")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_lint_and_format() -> None:
    if shutil.which("ruff") is None and _run("ruff", "--version").returncode != 0:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    lint = _run("ruff", "check", *CODE)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run("ruff", "format", "--check", *CODE)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_ci_type_checks_before_the_suite() -> None:
    """mypy runs in CI as its own step (``make typecheck``, the three packages), before the
    README's test command: a whole-tree check is too slow to pay on every ``pytest``."""
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    suite = next(n for n, line in enumerate(steps) if line.endswith("&& pytest"))
    assert "make lint typecheck" in steps[:suite], steps
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\ntypecheck:\n", 1)[1].split("\n\n", 1)[0]
    assert target.split() == [
        "mypy",
        "src/agentledger",
        "examples/src/agentledger_examples",
        "bench/src/agentledger_bench",
    ], target
