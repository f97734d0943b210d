"""A bulk `runs resume --status` that resumes nothing, or only some, of the runs it was
asked to resume exits 1 (as a resume of one run does), says per refused run why and
what to do, and counts them (issue 22)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentledger.cli._main import cli
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_resume_settle import FAULT, _unknown_payout, settle_app


def _lines_about(output: str, run_id: str) -> list[str]:
    """The lines that report on ``run_id`` (``resumed RUN ...``, ``refused RUN: ...``)."""
    return [
        line
        for line in output.splitlines()
        if len(line.split()) > 1 and line.split()[1].rstrip(":") == run_id
    ]


def test_a_bulk_resume_that_resumes_nothing_or_only_some_exits_1(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    FAULT.update(payout=None, confirm=None)
    h = Harness(tmp_path, settle_app(), url=store_url)

    async def seed() -> tuple[str, str, str]:
        async with h:
            first, _ = await _unknown_payout(h, "before_commit")
            second, _ = await _unknown_payout(h, "before_commit")
            FAULT["confirm"] = "bug"
            booked = await h.submit("booking")
            run = await h.drive(booked)
            assert run.status == RunStatus.FAILED, run  # charged, then refunded
            return first, second, booked

    first, second, booked = asyncio.run(seed())
    runner = CliRunner()

    def resume(*args: str) -> Any:
        return runner.invoke(cli, ["runs", "resume", *args, "--db", store_url])

    # Every run refused: each one's line says why and the command that unblocks it.
    out = resume("--status", "needs_human")
    assert out.exit_code == 1, out.output
    for run_id in (first, second):
        (line,) = _lines_about(out.output, run_id)
        assert line.startswith(f"refused {run_id}: "), line
        assert f"agentledger runs settle {run_id} 1 --applied" in line, line
    assert out.output.splitlines()[-1].startswith("resumed 0, refused 2"), out.output
    out = resume("--status", "needs_human", "--json")
    assert out.exit_code == 1, out.output
    assert {r["run_id"] for r in json.loads(out.stdout) if "refused" in r} == {first, second}

    # A refusal a force would lift names the forced command for that one run.
    out = resume("--status", "failed")
    assert out.exit_code == 1, out.output
    (line,) = _lines_about(out.output, booked)
    assert line.startswith(f"refused {booked}: ") and "compensated" in line, line
    assert f"`agentledger runs resume {booked} --force --reason R`" in line, line
    assert out.output.splitlines()[-1].startswith("resumed 0, refused 1"), out.output

    # Some resumed, some refused: still 1, with the counts.
    out = runner.invoke(cli, ["runs", "settle", first, "1", "--not-applied", "--reason",
                              "not at the provider", "--db", store_url])  # fmt: skip
    assert out.exit_code == 0, out.output
    out = resume("--status", "needs_human")
    assert out.exit_code == 1, out.output
    (line,) = _lines_about(out.output, first)
    assert line.startswith(f"resumed {first} "), line
    (line,) = _lines_about(out.output, second)
    assert line.startswith(f"refused {second}: "), line
    assert out.output.splitlines()[-1].startswith("resumed 1, refused 1"), out.output

    # Every run resumed: 0.
    out = runner.invoke(cli, ["runs", "settle", second, "1", "--not-applied", "--reason",
                              "not at the provider", "--db", store_url])  # fmt: skip
    assert out.exit_code == 0, out.output
    out = resume("--status", "needs_human")
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[-1] == "resumed 1, refused 0", out.output


def test_a_bulk_resume_meeting_a_held_sqlite_write_lock_stops_at_the_first_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite has one write lock for the whole file: when one run's resume waited for it
    past the busy timeout, every other run would wait as long in turn. The bulk stops
    there and reports the rest as not tried, changing nothing."""
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    FAULT.update(payout=None, confirm=None)
    path = tmp_path / "held.db"
    h = Harness(tmp_path, settle_app(), url=f"sqlite:///{path}")

    async def seed() -> list[str]:
        async with h:
            return [(await _unknown_payout(h, "before_commit"))[0] for _ in range(3)]

    ids = asyncio.run(seed())
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        out = CliRunner().invoke(
            cli,
            ["runs", "resume", "--status", "needs_human", "--db",
             f"sqlite:///{path}?busy_timeout_ms=200"],
        )  # fmt: skip
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert out.exit_code == 1, out.output
    lines = [line for run_id in ids for line in _lines_about(out.output, run_id)]
    assert len(lines) == 3, out.output
    assert "is locked by another process" in lines[0], lines
    for line in lines[1:]:
        assert "not tried" in line and "is locked by another process" in line, line
    # Nothing changed: every run still needs a human.
    with sqlite3.connect(path) as conn:
        statuses = {row[0] for row in conn.execute("SELECT status FROM runs")}
    assert statuses == {RunStatus.NEEDS_HUMAN}, statuses
