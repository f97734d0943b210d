"""The gateway overhead bench runs end to end with its server in another process."""

from __future__ import annotations

import json

import pytest

from agentledger_bench import gateway_overhead


def test_the_overhead_bench_prints_its_figures(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)  # the bench sets both; restored
    monkeypatch.setenv("OPENAI_API_KEY", "bench-key")
    gateway_overhead.main(["--calls", "20"])
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "gateway_overhead"
    assert out["server_ms_median"] > 0  # the header of the other process was read
    assert out["sdk_minus_server_ms_median"] > 0
    assert out["ours_ms_median"] == pytest.approx(
        out["model_minus_server_ms_median"] - out["sdk_minus_server_ms_median"], abs=1e-3
    )
