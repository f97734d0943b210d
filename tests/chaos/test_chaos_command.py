"""`agentledger chaos` as a subprocess: real workers, real SIGKILL/SIGSTOP, a real HTTP
provider on loopback behind the command's proxy. It passes a correct app and catches the
broken ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentledger._chaos.pgcluster import ClusterUnavailable, find_bindir
from agentledger_examples.chaos_demo.provider import PaymentsProvider
from tests.cli.helpers import cli_here

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.chaos_app:app"


def chaos(tmp_path: Path, *args: str, timeout: float = 240) -> tuple[int, dict[str, Any], str]:
    """Run ``agentledger chaos ARGS --json`` from the repository root (with a ``--timeout``
    inside the subprocess's, so that a slow host gets the command's report)."""
    limit = () if "--timeout" in args else ("--timeout", str(timeout - 60))
    # What a failed session keeps goes in the test's folder (a private cluster's folder
    # must stay where its own OS user can reach it).
    tmpdir = {} if "--pg-private" in args else {"TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", "chaos", *args, *limit, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "CHAOS_TEST_RECEIPTS": str(tmp_path / "receipts.txt"), **tmpdir},
        check=False,
    )
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    (tmp_path / "report.json").write_text(json.dumps(report, indent=1))  # to read on failure
    return proc.returncode, report, proc.stderr


def _by_invariant(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [v for v in report["violations"] if v["invariant"] == name]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_correct_app_passes_under_kills_freezes_and_faults(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    orders: str,
    provider: PaymentsProvider,
) -> None:
    db = ("--db", str(request.getfixturevalue("pg_url"))) if backend == "postgres" else ()
    code, report, stderr = chaos(
        tmp_path,
        "--app", APP, "--agent", "checkout", "--inputs", orders,
        # Two runs at a time per worker: the runs queue, so workers hold runs when the
        # first kill is due however fast the host is.
        "--runs", "10", "--workers", "2", "--concurrency", "2",
        "--kill-every", "3", "--freeze-every", "5",
        "--proxy", f"pay={provider.url}",
        "--faults", "pay:error_after_commit@0.3;pay:drop@0.15;pay:rate_limit@0.1;"
        "pay:in_progress@0.1;pay:timeout_after_commit@0.1,hold=3;seed=3",
        *db,
    )  # fmt: skip
    assert code == 0, (report.get("violations"), stderr[-2000:])
    assert report["ok"] and not report["violations"]
    assert sum(report["runs"].values()) == 10 and not report["timed_out"]
    assert report["kills"] >= 1, (report["kills"], report["resumes"], report["elapsed_s"])
    # Faults fired and every charge reached the provider once per key.
    fired = {f["fault"]: f["fired"] for f in report["proxies"]["pay"]["faults"]}
    assert fired["pay:error_after_commit@0.3"] > 0
    charges = provider.charges()
    assert len(charges) == len({c["key"] for c in charges})
    assert report["effects"]["at_proxies"] == len(charges)
    assert report["effects"]["by_hook"] >= 1


@pytest.mark.postgres
def test_a_correct_app_passes_on_a_private_postgres_restarted_under_it(
    tmp_path: Path, orders: str, provider: PaymentsProvider
) -> None:
    try:
        find_bindir()
    except ClusterUnavailable as exc:
        pytest.skip(f"no PostgreSQL binaries for a private cluster: {exc}")
    code, report, stderr = chaos(
        tmp_path,
        "--app", APP, "--agent", "checkout", "--inputs", orders,
        "--runs", "8", "--workers", "2", "--concurrency", "2", "--kill-every", "3",
        "--pg-private", "--pg-restart-every", "2",
        "--proxy", f"pay={provider.url}", "--faults", "pay:error_after_commit@0.3;seed=3",
    )  # fmt: skip
    assert code == 0, (report.get("violations"), stderr[-2000:])
    assert report["pg_restarts"] >= 1 and report["db"].startswith("postgresql://")
    charges = provider.charges()
    assert len(charges) == len({c["key"] for c in charges})


def test_a_tool_that_trusts_a_provider_ignoring_keys_is_caught(
    tmp_path: Path, orders: str, keyless_provider: PaymentsProvider
) -> None:
    code, report, stderr = chaos(
        tmp_path,
        "--app", APP, "--agent", "checkout_trusting", "--inputs", orders,
        "--runs", "4", "--workers", "2",
        "--proxy", f"pay={keyless_provider.url}",
        "--faults", "pay:error_after_commit,count=2",
    )  # fmt: skip
    assert code == 1, (report, stderr[-2000:])
    doubles = _by_invariant(report, "effects_per_key")
    assert doubles, report["violations"]
    # The report names the run, the step and the key, and the provider agrees.
    double = doubles[0]
    assert double["run"] and double["step"] is not None and double["key"]
    assert "took effect 2 times at pay" in double["what"]
    charged = [c for c in keyless_provider.charges() if c["key"] == double["key"]]
    assert len(charged) == 2


def test_a_status_check_that_lies_is_caught(
    tmp_path: Path, orders: str, keyless_provider: PaymentsProvider
) -> None:
    code, report, stderr = chaos(
        tmp_path,
        "--app", APP, "--agent", "checkout_lying", "--inputs", orders,
        "--runs", "4", "--workers", "2",
        "--proxy", f"pay={keyless_provider.url}",
        "--faults", "pay:error_after_commit,count=2",
    )  # fmt: skip
    assert code == 1, (report, stderr[-2000:])
    doubles = _by_invariant(report, "effects_per_key")
    assert doubles, report["violations"]
    charged = [c for c in keyless_provider.charges() if c["key"] == doubles[0]["key"]]
    assert len(charged) >= 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--app", "tests.apps.nowhere:app"), "tests.apps.nowhere"),
        (("--agent", "chekout"), "did you mean 'checkout'"),
        (("--inputs", "BAD"), "line 2 is not JSON"),
        (("--faults", "pay:explode"), "unknown fault kind 'explode'"),
        (("--faults", "mail:error"), "unknown endpoint 'mail'"),
        (("--proxy", "pay"), "give NAME=URL"),
        (("--pg-restart-every", "3"), "add --pg-private"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, orders: str, args: tuple[str, ...], message: str
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"order_id": "o-1", "amount": 5}\n{not json\n')
    options = {"--app": APP, "--agent": "checkout", "--inputs": orders}
    options["--proxy"] = "pay=http://127.0.0.1:9"
    given = dict(zip(args[::2], args[1::2], strict=True))
    if given.get("--inputs") == "BAD":
        given["--inputs"] = str(bad)
    options.update(given)
    flat = [x for pair in options.items() for x in pair]
    # Refused before anything starts: the command's own answer, in process.
    done = cli_here("chaos", *flat, "--json", cwd=ROOT,
                    env={"CHAOS_TEST_RECEIPTS": str(tmp_path / "receipts.txt")})  # fmt: skip
    code, stderr = done.returncode, done.stderr
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], stderr


ZOMBIES = ("--agent", "naps", "--runs", "6", "--workers", "2", "--freeze-every", "1.5")


def test_zombies_are_fenced(tmp_path: Path, orders: str) -> None:
    code, report, stderr = chaos(
        tmp_path, "--app", APP, "--inputs", orders, *ZOMBIES, "--lease-seconds", "1"
    )
    assert code == 0, (report.get("violations"), stderr[-2000:])
    assert report["freezes"] >= 2 and report["resumes"] >= 1


def test_writes_of_a_worker_that_lost_its_lease_are_caught(tmp_path: Path, orders: str) -> None:
    # The same, on workers whose journal fence was deleted: frozen past their lease and
    # thawed, they write into runs another worker claimed meanwhile.
    unfenced = "tests.apps.chaos_unfenced_app:app"
    code, report, stderr = chaos(
        tmp_path, "--app", unfenced, "--inputs", orders, *ZOMBIES, "--lease-seconds", "1"
    )
    assert code == 1, (report, stderr[-2000:])
    stale = _by_invariant(report, "stale_lease_writes")
    assert stale, report["violations"]
    assert stale[0]["run"] and stale[0]["step"] is not None
    assert "after worker" in stale[0]["what"]


def test_a_succeeded_step_executed_again_is_caught(tmp_path: Path, orders: str) -> None:
    # Workers whose replay forgets succeeded steps call every write of a resumed run
    # again, after the journal recorded it succeeded (they never finish: a timeout).
    forgetful = "tests.apps.chaos_forgetful_app:app"
    code, report, stderr = chaos(
        tmp_path, "--app", forgetful, "--agent", "tallies", "--inputs", orders,
        "--runs", "4", "--workers", "2", "--kill-every", "2", "--lease-seconds", "1",
        "--timeout", "6",
    )  # fmt: skip
    assert code == 1, (report, stderr[-2000:])
    again = _by_invariant(report, "succeeded_step_executed_again")
    assert again, report["violations"]
    assert again[0]["run"] and again[0]["step"] is not None and again[0]["key"]
    assert "was journaled succeeded, then its key" in again[0]["what"]
    assert report["timed_out"] and _by_invariant(report, "runs_settled")


def test_workers_that_cannot_start_stop_the_session(tmp_path: Path, orders: str) -> None:
    crashing = "tests.apps.chaos_crashing_app:app"
    code, report, stderr = chaos(
        tmp_path, "--app", crashing, "--agent", "checkout", "--inputs", orders, "--runs", "2"
    )
    assert code == 1, (report, stderr[-2000:])
    assert "workers exited by themselves" in report["gave_up"]
    assert "CHECKOUT_API_KEY is not set" in report["gave_up"]
    # Left queued, no worker holding them: unsettled and stuck, each named.
    assert report["invariants"]["runs_settled"] == report["invariants"]["no_stuck_runs"] == 2
    stuck = _by_invariant(report, "no_stuck_runs")
    assert all(v["run"] and "no live lease" in v["what"] for v in stuck)


def test_steps_past_the_budget_are_caught(tmp_path: Path) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text('"Are my orders paid?"\n')
    frugal = ("--agent", "frugal", "--inputs", str(questions), "--runs", "2", "--workers", "1")
    code, report, stderr = chaos(tmp_path, "--app", APP, *frugal)
    assert code == 0, (report.get("violations"), stderr[-2000:])
    assert report["runs"] == {"needs_human": 2}  # the runtime stopped them at the budget
    # On workers that never find a budget reached, every later step is past it.
    unbudgeted = "tests.apps.chaos_unbudgeted_app:app"
    code, report, stderr = chaos(tmp_path, "--app", unbudgeted, *frugal)
    assert code == 1, (report, stderr[-2000:])
    past = _by_invariant(report, "spend_within_budget")
    assert len(past) == 2 and all(v["step"] == 2 for v in past), past
    assert "of its budget (50 tokens" in past[0]["what"]
