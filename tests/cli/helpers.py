"""Running the CLI as a user does: ``python -m agentledger.cli._main ARGS`` in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``agentledger ARGS`` (output captured as text, never raising on a non-zero exit)."""
    return subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", *args],
        capture_output=True, text=True, check=False, cwd=cwd, timeout=120,
    )  # fmt: skip
