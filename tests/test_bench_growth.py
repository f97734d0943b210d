"""``agentledger bench --growth 2000 --json`` runs end to end on each backend: the fill
writes the finished steps, every query is timed before and after it, and the database
it made is gone afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentledger_bench.cli import bench
from agentledger_bench.growth import QUERIES, TEMPLATE_STEPS
from tests import dbutil
from tests.conftest import require_pg


def _exists(name: str) -> bool:
    import psycopg

    with psycopg.connect(dbutil.admin_url(), autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return found is not None


def test_growth_bench_runs(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--growth", "2000", "--rounds", "3", "--json"]
    if backend == "postgres":
        require_pg()
        args += ["--db", dbutil.admin_url()]
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # the progress lines go to stderr
    assert report["steps"] == 2000
    for phase in ("before", "after"):
        for query in QUERIES:
            figures = report[phase][query]
            assert figures["n"] >= 1, (phase, query)
            assert 0 < figures["p50_ms"] <= figures["p99_ms"], (phase, query, figures)
        assert report[phase]["claimed_per_claim"] == 50
    sizes = report["sizes_after"]
    template = TEMPLATE_STEPS  # the executed template run's own steps
    assert sizes["steps"]["rows"] == 2000 + template
    assert sizes["runs"]["rows"] == 200 + 1 + report["queued_runs"]
    assert sizes["outbox"]["rows"] == 200
    assert sizes["events"]["rows"] > sizes["steps"]["rows"]
    assert sizes["database_bytes"] > report["sizes_before"]["database_bytes"]
    if backend == "postgres":
        assert "kept" not in report
        assert not _exists(report["database"])
    assert not list(tmp_path.glob(".agentledger-growth-*"))  # the SQLite file removed
