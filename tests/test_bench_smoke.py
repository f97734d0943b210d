"""``agentledger bench --quick --json``: every figure is there and positive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentledger_bench.cli import bench

KEYS = [
    "raw_commit_us",
    "read_step_us",
    "read_step_ratio",
    "ctx_step_us",
    "ctx_step_ratio",
    "write_step_us",
    "write_step_ratio",
    "concurrent_steps_per_s",
    "bytes_growth_500_over_100",
    "stored_bytes_over_payload",
]


@pytest.mark.long
def test_bench_quick_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(bench, ["--quick", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for key in KEYS:
        assert isinstance(report[key], int | float), key
        assert report[key] > 0, (key, report[key])
    assert report["group_sizes"]["median"] >= 1
    assert report["quick"] is True
    assert not list(tmp_path.glob(".agentledger-bench-*"))  # temp files removed
