"""`agentledger demo` as a subprocess: real workers, real SIGKILLs, real faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentledger_examples.stayhub.sandbox import INVARIANTS
from tests.cli.helpers import cli_here

pytestmark = pytest.mark.slow


def run_demo(
    *args: str, env: dict[str, str] | None = None, timeout: float = 150
) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", "demo", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


@pytest.mark.long
def test_demo_defaults() -> None:
    code, report, stderr = run_demo()
    assert code == 0, (report, stderr)
    assert report["runs"] == {"completed": 20}
    assert set(report["invariants"]) == set(INVARIANTS)
    assert all(report["invariants"][k] == 0 for k in INVARIANTS)
    # Every tenth guest cancels after paying: refunded and cancelled, no CRM, no email.
    assert report["outbox"] == {"delivered": 36, "pending": 0, "dead": 0}
    assert report["ledger"]["charges"] == 20 and report["ledger"]["emails"] == 18
    assert report["uncharged"] == []
    assert report["ledger"]["refunds"] == report["ledger"]["cancellations"] == 2
    assert report["faults"] is None and report["faults_fired"] == []
    assert report["duration_p50_s"] is not None and report["tokens"] > 0
    assert report["worker_logs"] is None  # a temporary database: nothing is kept


# Each fault likely enough to fire within the test's few runs (the verdict needs every
# fault to fire), each hold longer than the tool timeouts the test sets.
CHAOS = (
    "payments.create:timeout_after_commit@0.25,hold=8;"
    "bookings.create:timeout_after_commit@0.2,hold=8;"
    "search:rate_limit@0.3,retry_after=1,count=8;email:error@0.3;seed=7"
)


@pytest.mark.long
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_demo_with_kills_and_faults(backend: str, request: pytest.FixtureRequest) -> None:
    db = ("--db", str(request.getfixturevalue("pg_url"))) if backend == "postgres" else ()
    # Enough runs that kills land on workers holding them and held calls are lost to
    # their timeouts: each run of the demo is the same booking, more show no more. Every
    # kill starts a worker again, its import paid anew: kills a few seconds apart.
    code, report, stderr = run_demo(
        "--runs",
        "24",
        "--workers",
        "2",
        "--kill-every",
        "3",
        "--faults",
        CHAOS,
        *db,
        # Short enough that the held calls (8 s) time out, long enough that a call a
        # loaded host merely slows down does not time out at every attempt.
        env={"STAYHUB_PAYMENT_TIMEOUT": "5", "STAYHUB_BOOKING_TIMEOUT": "5"},
    )
    assert code == 0, (report, stderr)
    assert report["not_terminal"] == 0
    # Faults and kills are the infrastructure failing, never the runs: every booking stands.
    assert report["runs"] == {"completed": 24}, report["runs"]
    assert all(report["invariants"][k] == 0 for k in INVARIANTS), report["violations"]
    assert report["kills"] >= 1 and report["resumes"] >= 1
    # A run that gave up (a provider that kept failing past its retries) says why here.
    assert report["uncharged"] == [], report["uncharged"]
    assert report["ledger"]["charges"] == 24 and report["ledger"]["bookings"] == 24


@pytest.mark.long
def test_demo_default_chaos_mix() -> None:
    """``--kill-every`` alone installs the default chaos mix; the verdict also needs every
    fault to fire and no outbox row to die."""
    code, report, stderr = run_demo(
        "--runs", "50", "--workers", "2", "--kill-every", "2", timeout=400
    )
    assert report["faults"] and "error_after_commit" in report["faults"], report
    assert "crm:keyless" in report["faults"]
    assert report["faults_never_fired"] == [], report["faults_fired"]
    assert report["outbox"]["dead"] == 0, report["outbox"]
    assert all(report["invariants"][k] == 0 for k in INVARIANTS), report["violations"]
    assert code == 0, (report, stderr)


def test_demo_help_says_what_runs_by_default() -> None:
    proc = cli_here("demo", "--help")
    text = " ".join(proc.stdout.split())
    assert "default chaos mix" in text and "crm:keyless" in text
    assert "Every tenth guest cancels" in text


def test_demo_rejects_a_bad_fault_spec() -> None:
    proc = cli_here("demo", "--faults", "nope:nothing", "--json")
    assert proc.returncode == 2 and "--faults" in proc.stderr


@pytest.mark.long
def test_a_fault_that_never_met_its_operation_is_reported_not_failed() -> None:
    """Three guests, none cancels: no refund is asked for, so the refund fault had no
    chance. A fault that met its operation and never fired still fails the verdict."""
    code, report, stderr = run_demo(
        "--runs", "3", "--workers", "1",
        "--faults", "payments.refund:hold,hold=1;bookings.create:error@0.0",
    )  # fmt: skip
    assert report["faults_not_met"] == ["payments.refund:hold,hold=1"], report["faults_fired"]
    assert report["faults_never_fired"] == ["bookings.create:error@0"], report["faults_fired"]
    assert code == 1 and not report["ok"], (report, stderr)
    code, report, stderr = run_demo(
        "--runs", "3", "--workers", "1", "--faults", "payments.refund:hold,hold=1"
    )
    assert report["faults_not_met"] == ["payments.refund:hold,hold=1"]
    assert report["faults_never_fired"] == []
    assert report["runs"] == {"completed": 3}
    assert code == 0 and report["ok"], (report, stderr)


@pytest.mark.long
def test_demo_with_db_says_where_the_worker_logs_are(tmp_path: Any) -> None:
    """With --db the workers' logs are kept beside it and the text says where (without,
    nothing is kept: test_demo_defaults)."""
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    text = subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", "demo", "--runs", "1", "--workers", "1",
         "--db", url],
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    said = [line for line in text.stdout.splitlines() if line.startswith("worker logs: ")]
    assert len(said) == 1 and "/worker-*.log" in said[0], text.stdout
    logs = Path(said[0].removeprefix("worker logs: ").split("/worker-*.log")[0])
    assert (logs / "worker-1.log").exists(), said
    # The command to read a run again is on one line, whole: it can be copied.
    again = [line for line in text.stdout.splitlines() if line.startswith("read it again: ")]
    assert len(again) == 1 and again[0].endswith(f"--db {url}"), text.stdout
