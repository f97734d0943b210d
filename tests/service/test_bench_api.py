"""`agentledger bench --api` runs end to end (small sizes; figures are not asserted)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentledger.cli._main import cli
from agentledger_bench.api import run_api_bench

_AT_RATE = {
    "mode", "target_per_s", "seconds", "requests", "connections", "accepted_per_s",
    "p50_ms", "p90_ms", "p99_ms", "max_ms", "errors", "statuses", "failures",
    "send_late_p99_ms", "load_generator_cpu_ms_per_request", "server_cpu_ms_per_request",
}  # fmt: skip


async def test_api_bench_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    # The fixed-rate phases as short as the command allows (--rate-seconds 0.1).
    report = await run_api_bench(
        None, requests=40, concurrency=4, streams=3, rate=100, rate_seconds=0.1
    )
    assert report["post_runs"]["statuses"] == {202: 40}
    assert report["post_runs"]["mode"] == "closed loop"
    assert report["post_runs_idempotency_key"]["statuses"] == {202: 40}
    for name in ("post_runs_at_rate", "post_runs_at_rate_idempotency_key"):
        phase = report[name]
        assert set(phase) == _AT_RATE, name
        assert phase["mode"].startswith("fixed rate")
        assert (phase["requests"], phase["statuses"], phase["errors"]) == (10, {202: 10}, 0)
        assert 0 < phase["p50_ms"] <= phase["p99_ms"] <= phase["max_ms"]
        assert phase["accepted_per_s"] > 0
    assert report["sse"]["events"] == 15  # 3 runs x 5 steps
    assert list(tmp_path.iterdir()) == []  # the temporary database is removed


def test_api_bench_cli_quick_rate_zero_skips_fixed_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench --api --quick --rate 0`: the closed-loop phases and SSE, no fixed-rate ones."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    result = CliRunner().invoke(cli, ["bench", "--api", "--quick", "--rate", "0"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["post_runs"]["statuses"] == {"202": 300}
    assert "post_runs_at_rate" not in report
    assert report["sse"]["streams"] == 20
