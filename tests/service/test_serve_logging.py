"""``agentledger serve`` says what it does, as the worker does: a line naming the app,
the database and the address once it listens, one access line per request, and the
inline workers' run lines; ``--log-format json`` makes each a JSON object, ``-v`` adds
the steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.service.conftest import PEPPER

ROOT = Path(__file__).resolve().parents[2]


def _key(db: str) -> str:
    env = {**os.environ, "AGENTLEDGER_KEY_PEPPER": PEPPER.decode()}
    return subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", "keys", "create", "--tenant", "t1",
         "--user", "ann", "--roles", "operator", "--expires-in", "1d", "--db", db],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


class Lines:
    """The JSON log lines of a process's stderr, read up to the one a test waits for."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.seen = proc, []  # type: ignore[var-annotated]

    def until(self, want: Any) -> dict[str, Any]:
        assert self.proc.stderr is not None
        for entry in self.seen:
            if want(entry):
                return entry  # type: ignore[no-any-return]
        while True:
            line = self.proc.stderr.readline()
            assert line, "serve exited; it logged:\n" + "\n".join(map(str, self.seen))
            try:
                entry = json.loads(line)
            except ValueError:
                raise AssertionError(f"not a JSON log line: {line!r}") from None
            self.seen.append(entry)
            if want(entry):
                return entry  # type: ignore[no-any-return]


def test_serve_logs_its_start_the_requests_and_the_runs_as_json(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'log.db'}"
    key = _key(db)
    env = {**os.environ, "AGENTLEDGER_KEY_PEPPER": PEPPER.decode()}
    command = [
        sys.executable, "-m", "agentledger.cli._main", "serve", "-v", "--log-format", "json",
        "--app", "tests.service.service_app:app", "--db", db, "--port", "0",
        "--workers-inline", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc)
        start = lines.until(lambda e: "listening on http://" in e["message"])
        message = start["message"]
        assert start["logger"] == "agentledger.service" and start["level"] == "info"
        assert "app service-tests" in message and db in message and "echo@1" in message
        assert "1 inline worker" in message
        url = message.split("listening on ")[1].split()[0].rstrip(",")
        with httpx.Client(base_url=url, timeout=30) as client:
            auth = {"Authorization": f"Bearer {key}", "X-Request-Id": "req-log-1"}
            body = {"workflow": "echo", "input": {"text": "hi", "steps": 1}}
            r = client.post("/v1/runs", json=body, headers=auth)
            assert r.status_code == 202, r.text
            run = r.json()["id"]
            access = lines.until(lambda e: e["logger"] == "agentledger.access")
            assert access["message"].startswith("POST /v1/runs 202 "), access
            assert "req-log-1" in access["message"] and "tenant t1" in access["message"]
            assert client.get("/v1/runs/nope", headers=auth).status_code == 404
            lines.until(lambda e: e["message"].startswith("GET /v1/runs/nope 404 "))
            lines.until(lambda e: e["message"].startswith(f"run {run} (echo@1) claimed"))
            lines.until(lambda e: e["message"].startswith(f"run {run} step 1 "))  # -v
            done = lines.until(lambda e: e["message"].startswith(f"run {run} completed"))
            assert done["logger"] == "agentledger.worker"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_an_inline_worker_that_stops_on_an_error_is_logged_and_makes_serve_unready(
    tmp_path: Path,
) -> None:
    """A run accepted by a `serve` whose only worker died would wait for nobody: the
    death is an error line naming the cause, and /readyz answers 503 so a process
    manager or load balancer takes the process out (/healthz still answers)."""
    db = f"sqlite:///{tmp_path / 'broken.db'}"
    command = [
        sys.executable, "-m", "agentledger.cli._main", "serve", "--log-format", "json",
        "--app", "tests.service.broken_startup_app:app", "--db", db, "--port", "0",
        "--workers-inline", "1",
    ]  # fmt: skip
    env = {**os.environ, "AGENTLEDGER_KEY_PEPPER": PEPPER.decode()}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc)
        start = lines.until(lambda e: "listening on http://" in e["message"])
        url = start["message"].split("listening on ")[1].split()[0].rstrip(",")
        died = lines.until(lambda e: "inline worker stopped" in e["message"])
        assert died["level"] == "error" and died["logger"].startswith("agentledger.service"), died
        assert "crm.internal:443" in died["message"], died
        with httpx.Client(base_url=url, timeout=30) as client:
            ready = client.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert "inline worker stopped" in ready.json()["detail"], ready.text
            assert "crm.internal:443" in ready.json()["detail"], ready.text
            assert client.get("/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
