"""The code stays lint-clean and type-checked: CI proves it with the same command as tests."""

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


def test_mypy() -> None:
    if _run("mypy", "--version").returncode != 0:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    result = _run(
        "mypy",
        "src/agentledger",
        "examples/src/agentledger_examples",
        "bench/src/agentledger_bench",
    )
    assert result.returncode == 0, result.stdout + result.stderr
