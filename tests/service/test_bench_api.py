"""`agentledger bench --api` runs end to end (small sizes; figures are not asserted)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentledger.service.bench import run_api_bench


async def test_api_bench_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    report = await run_api_bench(None, requests=40, concurrency=4, streams=3)
    assert report["post_runs"]["statuses"] == {202: 40}
    assert report["post_runs_idempotency_key"]["statuses"] == {202: 40}
    assert report["sse"]["events"] == 15  # 3 runs x 5 steps
    assert list(tmp_path.iterdir()) == []  # the temporary database is removed
