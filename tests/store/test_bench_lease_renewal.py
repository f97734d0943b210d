"""``python -m agentledger_bench.lease_renewal`` runs on each backend: both renewals
renew every lease (the bench asserts none is lost) and every size gets its figures."""

from __future__ import annotations

import json

import pytest

from agentledger_bench import lease_renewal


def test_lease_renewal_bench_runs(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    lease_renewal.main(["--db", store_url, "--leases", "1,7", "--others", "100", "--reps", "2",
                        "--json"])  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    for size in ("1", "7"):
        for key in lease_renewal._KEYS:
            assert result[size][key]["median_us"] > 0, (size, key)
