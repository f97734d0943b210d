"""``python -m agentledger_bench.step_cpu --window`` runs on each backend: figure (d)
measured inside its window names each thread's CPU per step (the event loop's and the
store's writer's among them) and, where ``/proc`` has them, the bytes written per step.
How much is not asserted: a short window may fall between two samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentledger_bench import step_cpu


def test_step_cpu_window_runs(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_cpu, "RUNS", 6)
    monkeypatch.setattr(step_cpu, "STEPS", 3)
    assert step_cpu.main(["--db", store_url, "--window"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps_per_s"] > 0 and report["window_s"] > 0
    threads = report["thread_cpu_us_per_step"]
    assert {"MainThread", "agentledger-store"} <= set(threads)
    assert all(value >= 0 for value in threads.values())
    if Path("/proc/self/io").exists():
        assert report["bytes_written_per_step"] >= 0
        assert report["write_calls_per_step"] >= 0
