"""`agentledger soak` as a subprocess, in a few seconds: real workers and SIGKILLs, a real
HTTP provider on loopback behind the command's proxy, a SQLite file. It samples to a CSV
with its columns and an SVG, and exits 1 when an invariant breaks."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from agentledger._chaos.sampling import COLUMNS
from agentledger._chaos.soak import LEAK_MIN_SECONDS, leak_verdict
from agentledger._chaos.soakplot import KILL
from agentledger_examples.chaos_demo.provider import PaymentsProvider
from tests.cli.helpers import cli_here

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.chaos_app:app"
# A short lease: a killed worker's runs are taken over within the few seconds of the test.
SHORT = ("--minutes", "0.1", "--rate", "3", "--workers", "2", "--sample-every", "1")
SHORT += ("--lease-seconds", "2")
# As many runs as SHORT in half the time: the samples, kills and approvals of the mix.
BRISK = ("--minutes", "0.05", "--rate", "6", *SHORT[4:])


def soak(tmp_path: Path, *args: str, timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [
            sys.executable, "-m", "agentledger.cli._main", "soak",
            "--db", f"sqlite:///{tmp_path / 'soak.db'}", "--out", str(tmp_path / "out"),
            "--drain-timeout", "60", *args, "--json",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "CHAOS_TEST_RECEIPTS": str(tmp_path / "receipts.txt"),
             "CHECKOUT_RECEIPTS": str(tmp_path / "receipts.txt"),
             "CHECKOUT_CONFIRMATIONS": str(tmp_path / "confirmations.txt"),
             "TMPDIR": str(tmp_path)},
        check=False,
    )  # fmt: skip
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


def test_a_soak_samples_to_a_csv_and_an_svg_and_passes_a_correct_app(
    tmp_path: Path, provider: PaymentsProvider
) -> None:
    # The example's mix: orders (a large one asks a manager, one the provider refuses)
    # and an agent, under kills and faults.
    orders = tmp_path / "mix.jsonl"
    amounts = [1000, 60_000, 1200, 0, 1300]
    orders.write_text(
        "\n".join(json.dumps({"order_id": f"o-{i}", "amount": a}) for i, a in enumerate(amounts))
    )
    desk = tmp_path / "desk.jsonl"
    desk.write_text('"Charge the desk order."\n')
    code, report, stderr = soak(
        tmp_path, "--app", "agentledger_examples.chaos_demo.app:app",
        "--agent", "order", "--inputs", str(orders), "--agent", "clerk", "--inputs", str(desk),
        *BRISK, "--kill-every", "2", "--approve-after", "0",
        "--proxy", f"pay={provider.url}", "--faults", "pay:error_after_commit@0.3;seed=3",
    )  # fmt: skip
    assert code == 0, (report.get("violations"), stderr[-2000:])
    assert report["ok"] and not report["violations"] and report["unsettled_at_end"] == 0
    assert report["kept"] is None
    assert report["submitted"] == sum(report["runs"].values()) >= 10
    assert report["runs"]["failed"] >= 1 and report["runs"]["completed"] >= 5, report["runs"]
    assert sum(report["approvals"].values()) >= 1
    with (tmp_path / "out" / "soak.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames or ()) == COLUMNS
    assert len(rows) == report["samples"] >= 3
    assert all(float(r["rss_total_mb"]) > 0 and int(r["workers"]) >= 1 for r in rows)
    assert sum(int(r["steps"]) for r in rows) >= report["submitted"]
    assert int(rows[-1]["submitted"]) == report["submitted"]
    assert int(rows[-1]["approvals_decided"]) == sum(report["approvals"].values())
    svg = ET.parse(tmp_path / "out" / "soak.svg").getroot()
    paths = [e for e in svg.iter("{http://www.w3.org/2000/svg}path") if e.get("d")]
    assert len(paths) == 5  # two memory lines, three latency lines
    ticks = [e for e in svg.iter("{http://www.w3.org/2000/svg}line") if e.get("stroke") == KILL]
    assert len(ticks) == 2 * report["kills"]  # each kill marked on both panels
    charges = provider.charges()
    assert len(charges) == len({c["key"] for c in charges})
    # Every completed order mailed its confirmation through the outbox, once.
    mailed = (tmp_path / "confirmations.txt").read_text().splitlines()
    assert len(mailed) == len({line.split()[-1] for line in mailed}) >= 1


def test_a_soak_exits_1_when_an_invariant_breaks(
    tmp_path: Path, orders: str, keyless_provider: PaymentsProvider
) -> None:
    code, report, stderr = soak(
        tmp_path, "--app", APP, "--agent", "checkout_trusting", "--inputs", orders, *SHORT,
        "--kill-every", "0", "--proxy", f"pay={keyless_provider.url}",
        "--faults", "pay:error_after_commit,count=2",
    )  # fmt: skip
    assert code == 1, (report, stderr[-2000:])
    doubles = [v for v in report["violations"] if v["invariant"] == "effects_per_key"]
    assert doubles and doubles[0]["run"] and doubles[0]["key"], report["violations"]
    assert report["kept"] and Path(report["kept"]).is_dir()  # the workers' logs
    # The samples are written however it ends.
    assert (tmp_path / "out" / "soak.csv").read_text().startswith(",".join(COLUMNS))
    assert (tmp_path / "out" / "soak.svg").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--hours H or --minutes M"),
        (("--hours", "1", "--minutes", "3"), "--hours H or --minutes M"),
        (("--minutes", "1", "--inputs", "ORDERS"), "1 --agent and 2 --inputs"),
        (("--minutes", "1", "--pg-restart-every", "5"), "restarts only the private cluster"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, orders: str, args: tuple[str, ...], message: str
) -> None:
    given = tuple(orders if a == "ORDERS" else a for a in args)
    # Refused before anything starts: the command's own answer, in process.
    done = cli_here(
        "soak", "--db", f"sqlite:///{tmp_path / 'soak.db'}", "--out", str(tmp_path / "out"),
        "--drain-timeout", "60", "--app", APP, "--agent", "checkout", "--inputs", orders,
        *given, "--json", cwd=ROOT,
        env={"CHAOS_TEST_RECEIPTS": str(tmp_path / "receipts.txt"),
             "CHECKOUT_RECEIPTS": str(tmp_path / "receipts.txt"),
             "CHECKOUT_CONFIRMATIONS": str(tmp_path / "confirmations.txt")},
    )  # fmt: skip
    code, stderr = done.returncode, done.stderr
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "soak.db").exists()


def _rows(mb_at: list[tuple[float, float]]) -> list[dict[str, Any]]:
    return [{"t_s": t, "rss_total_mb": f"{mb:.1f}"} for t, mb in mb_at]


def test_the_leak_rule_is_the_slope_over_the_second_half() -> None:
    hour = 3600.0
    # Warm-up growth in the first half is not a leak; 30 MB/h in the second half is.
    flat = _rows([(t, 100 + (50 if t > 60 else t * 50 / 60)) for t in range(0, 3601, 10)])
    growing = _rows([(t, 150 + 30 * t / hour) for t in range(0, 3601, 10)])
    assert not leak_verdict(flat, hour, 20)["leaked"]
    verdict = leak_verdict(growing, hour, 20)
    assert verdict["leaked"] and verdict["slope_mb_per_hour"] == pytest.approx(30, abs=0.1)
    # A second half shorter than the rule's least is not judged.
    short = 2 * LEAK_MIN_SECONDS - 20
    steep = _rows([(t, 100 + t) for t in range(0, int(short) + 1, 10)])
    assert not leak_verdict(steep, short, 20)["judged"]
