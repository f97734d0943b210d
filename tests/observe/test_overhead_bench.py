"""``python -m agentledger_bench.observe_overhead``: every figure is there, the OTLP
condition really exported spans and scraped /metrics, and tracing is off afterwards."""

from __future__ import annotations

import json

import pytest

from agentledger.observe import _tracing as tracing
from agentledger_bench import observe_overhead


def test_observe_overhead_quick(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--reps", "1", "--steps", "10", "--scrape-every", "0.01"]
    assert observe_overhead.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    for figure in ("read_step", "ctx_step"):
        for name in observe_overhead.CONDITIONS:
            assert report[f"{figure}_us_{name}"] > 0
        assert report[f"{figure}_ratio_otlp"] > 0 and report[f"{figure}_ratio_memory"] > 0
    assert report["otlp_exports"]["requests"] >= 1 and report["otlp_exports"]["bytes"] > 0
    assert report["scrapes"] >= 1 and report["scrape_errors"] == 0
    assert report["histogram_observe_us"] > 0
    assert isinstance(report["target_met"], bool)
    assert isinstance(report["target_met_fast_encoder"], bool)
    tracing.set_provider(None)


def test_observe_overhead_compare(capsys: pytest.CaptureFixture[str]) -> None:
    # --compare adds the otlp provider with larger batches and with sampling, each
    # exported to the collector, and tracing is off after.
    argv = ["--reps", "1", "--steps", "10", "--scrape-every", "0.01", "--compare"]
    assert observe_overhead.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    for name in observe_overhead.CONDITIONS + observe_overhead.COMPARE:
        assert report[f"read_step_cpu_us_{name}"] > 0
        assert report[f"read_step_loop_cpu_us_{name}"] > 0  # the event loop's thread alone
    assert report["heap_frozen"] is False
    assert report["read_step_ratio_otlp_batch_2048"] > 0
    assert tracing._PROVIDER is None


def test_observe_overhead_only(capsys: pytest.CaptureFixture[str]) -> None:
    # --only measures the named conditions beside `none`, a --compare one included.
    argv = ["--reps", "1", "--steps", "10", "--only", "otlp_fast_encoder,otlp_switch_1ms"]
    assert observe_overhead.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    measured = {k.removeprefix("read_step_us_") for k in report if k.startswith("read_step_us_")}
    assert measured == {"none", "otlp_fast_encoder", "otlp_switch_1ms"}
    assert "target_met" not in report and isinstance(report["target_met_fast_encoder"], bool)
    assert report["otlp_exports"]["requests"] >= 1
    assert tracing._PROVIDER is None
