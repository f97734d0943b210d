"""``agentledger serve`` as a process: ``--metrics-port`` serves ``/metrics`` without a
key on a port of its own, while the API port's ``/metrics`` asks for one (issue 19,
point 11)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.service.conftest import PEPPER, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_serve_metrics_port_answers_without_a_key(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "AGENTLEDGER_KEY_PEPPER": PEPPER.decode()}
    command = [
        sys.executable, "-c", "from agentledger.cli._main import main; main()", "serve",
        "--app", "tests.service.service_app:app", "--db", f"sqlite:///{tmp_path / 's.db'}",
        "--port", str(port), "--metrics-port", "0", "--header-timeout", "2",
        "--webhook-allow-host", "127.0.0.1",
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        found = None
        while found is None:
            line = proc.stderr.readline()
            assert line, "serve exited: " + "".join(lines)
            lines.append(line)
            found = re.search(r"metrics on http://[^:]+:(\d+)/metrics", line)
        with urllib.request.urlopen(f"http://127.0.0.1:{found.group(1)}/metrics", timeout=30) as r:
            assert r.status == 200 and b"agentledger_runs" in r.read()
        give_up = time.monotonic() + 60
        while True:  # the API port answers once uvicorn has bound it
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30)
                raise AssertionError("/metrics answered without a key on the API port")
            except urllib.error.HTTPError as exc:
                assert exc.code == 401
                break
            except urllib.error.URLError:
                assert time.monotonic() < give_up and proc.poll() is None, "".join(lines)
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_serve_metrics_host_puts_the_keyless_metrics_on_that_address(tmp_path: Path) -> None:
    """127.0.0.2 is loopback on Linux, but not the default 127.0.0.1: a scrape there
    answers only when ``--metrics-host`` was honoured."""
    env = {**os.environ, "AGENTLEDGER_KEY_PEPPER": PEPPER.decode()}
    command = [
        sys.executable, "-c", "from agentledger.cli._main import main; main()", "serve",
        "--app", "tests.service.service_app:app", "--db", f"sqlite:///{tmp_path / 's.db'}",
        "--port", "0", "--metrics-port", "0", "--metrics-host", "127.0.0.2",
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        found = None
        while found is None:
            line = proc.stderr.readline()
            assert line, "serve exited: " + "".join(lines)
            lines.append(line)
            found = re.search(r"metrics on http://([^:]+):(\d+)/metrics", line)
        assert found.group(1) == "127.0.0.2", line
        port = found.group(2)
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=30) as r:
            assert r.status == 200 and b"agentledger_runs" in r.read()
        try:  # nothing of it on the default address
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30)
            raise AssertionError("/metrics answered on 127.0.0.1 too")
        except urllib.error.URLError as exc:
            assert isinstance(exc.reason, ConnectionRefusedError), exc
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
