"""``python -m agentledger_bench.fair_claim`` runs on each backend, and the store's claim
takes as many runs as the full-rank statement in every shape."""

from __future__ import annotations

import json

import pytest

from agentledger_bench import fair_claim


def test_fair_claim_bench_runs(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    fair_claim.main(["--db", store_url, "--runs", "400", "--claims", "1", "--tenants", "60",
                     "--limit", "20", "--json"])  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    for shape in fair_claim.SHAPES:
        claimed = result[shape]["claimed"]
        assert claimed["claim"] == claimed["full_rank"] == 20, (shape, claimed)
        assert result[shape]["claim"]["median_ms"] > 0
