"""``python -m agentledger_bench.prune_latency`` runs on each backend: the history is
pruned whole by the other process while the probe worker steps, before and after."""

from __future__ import annotations

import json

import pytest

from agentledger_bench import prune_latency


def test_prune_latency_bench_runs(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prune_latency.main(["--db", store_url, "--steps", "300", "--waves", "1", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["prune"]["runs"] == result["history_runs"] == 3, result
    assert result["prune"]["records"] > 300 and result["prune"]["stopped"] is None, result
    for phase in ("before", "after"):
        assert result[phase]["steps"] == prune_latency.WAVE * prune_latency.WAVE_STEPS
        assert 0 < result[phase]["p50_ms"] <= result[phase]["p99_ms"] <= result[phase]["max_ms"]
