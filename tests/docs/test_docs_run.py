"""Every code block in the README and docs/ runs as written.

Blocks are taken in document order, each document in its own empty folder:

* a ``python`` block whose first line is ``# NAME.py`` is appended to that file;
* any other ``python`` block runs as a script (after the files so far are written);
* a ``console`` block runs in bash (``set -e``): lines start with ``$ ``, the rest is
  output and ignored. ``PORT`` is a free port (a block that serves listens there), and
  whatever a block started in the background is stopped when it ends. The README's
  ``agentledger chaos`` block runs as written in tests/chaos/test_readme_chaos.py,
  which also reads its report, not a second time here.

``sh`` / plain blocks are reference material (command tables, sandbox examples that
start servers) and are not run.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
FILE_HEADER = re.compile(r"^# ([\w/.-]+\.py)\n")


def blocks(doc: Path) -> list[tuple[str, str]]:
    """The (language, text) of every fenced block of ``doc``, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(doc.read_text())]


def runnable(doc: Path) -> bool:
    return any(lang in ("python", "console") for lang, _ in blocks(doc))


def _env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    env.pop("AGENTLEDGER_DB", None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env["PORT"] = str(s.getsockname()[1])
    return env


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    assert result.returncode == 0, (
        f"{what} failed ({result.returncode}):\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-3000:]}"
    )


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("doc", [d for d in DOCS if runnable(d)], ids=lambda d: d.name)
def test_code_blocks_run_as_written(doc: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    ran = 0
    for n, (lang, text) in enumerate(blocks(doc), 1):
        if lang == "python":
            header = FILE_HEADER.match(text)
            if header:
                target = tmp_path / header.group(1)
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("a") as f:
                    f.write(text[header.end() :] + "\n")
                continue
            result = subprocess.run(
                [sys.executable, "-c", text],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            _check(result, f"{doc.name} python block {n}")
            ran += 1
        elif lang == "console" and "$ agentledger chaos " in text:
            continue  # run as written, its report read, by tests/chaos/test_readme_chaos.py
        elif lang == "console":
            commands = [line[2:] for line in text.splitlines() if line.startswith("$ ")]
            script = "set -euo pipefail\n" + "\n".join(commands)
            _check(_bash(script, tmp_path, env), f"{doc.name} console block {n}")
            ran += 1
    assert ran > 0


def _bash(script: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in its own process group; what it left running (a server started
    with ``&`` by a block that failed before stopping it) is stopped after it. Output
    goes to files: a process left running would hold a pipe open."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=folder, env=env, text=True, start_new_session=True,
            stdout=out, stderr=err,
        )  # fmt: skip
        try:
            proc.wait(timeout=180)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
