"""`agentledger worker` refuses settings that would make it misbehave, in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.helpers import ROOT, Env


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("--lease-seconds", "0"), "--lease-seconds"),
        (("--concurrency", "0"), "--concurrency"),
        (("--poll-seconds", "0"), "--poll-seconds"),
        (("--lease-seconds", "6", "--heartbeat-seconds", "6"), "--heartbeat-seconds"),
        (("--lease-seconds", "nan"), "--lease-seconds"),
    ],
)
def test_bad_worker_settings_exit_with_one_line(
    tmp_path: Path, args: tuple[str, ...], option: str
) -> None:
    env = Env(tmp_path)  # not the `env` fixture: its database file is made in advance
    result = subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", "worker", "--app",
         "tests.apps.engine_app:app", "--db", env.url, *args],
        cwd=ROOT, env=env.child_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert option in lines[0]
    assert not env.db_path.exists()  # refused before touching the database
