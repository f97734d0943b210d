"""Retention (docs/architecture.md, "Retention"): `agentledger prune` removes finished
runs with every row they hold, never what is unfinished or unsettled, and the audit
chain still verifies -- its pruned front replaced by a signed summary -- while tampering
with what is left, or with the summary, is still found."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentledger.cli._main import cli
from agentledger.store import Store
from agentledger.store._queries import retention
from agentledger.worker import Worker, WorkerConfig
from tests.service import service_app

KEY = "0f9b6c1d2e3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c"
ENV = "AGENTLEDGER_AUDIT_KEY"


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)


async def run_cli(*args: str, key: str | None = KEY) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), env={ENV: key})


async def _finished(store: Store, tenant: str, n: int, steps: int = 2) -> list[str]:
    ids = [
        await service_app.app.submit(
            store, "echo", {"text": str(i), "steps": steps}, tenant_id=tenant
        )
        for i in range(n)
    ]
    await Worker(store, service_app.app, WorkerConfig(poll_seconds=0.02), burst=True).run(
        install_signals=False
    )
    return ids


async def _count(store: Store, sql: str, params: dict[str, Any] | None = None) -> int:
    rows = await store.read(lambda tx: tx.fetchall(sql, params or {}))
    return int(rows[0]["n"])


async def _rows_of(store: Store, run_id: str) -> dict[str, int]:
    out = {}
    for table in ("steps", "effects", "outbox", "approvals", "events"):
        out[table] = await _count(
            store, f"SELECT COUNT(*) AS n FROM {table} WHERE run_id = :r", {"r": run_id}
        )
    out["runs"] = await _count(store, "SELECT COUNT(*) AS n FROM runs WHERE id = :r", {"r": run_id})
    return out


async def test_prune_removes_finished_runs_and_the_chain_still_verifies(
    keyed: None, store: Store, store_url: str, tmp_path: Path
) -> None:
    old = await _finished(store, "t1", 3)
    kept_other = await _finished(store, "t2", 1)
    checkpoint = await run_cli("audit", "checkpoint", "--db", store_url)
    assert checkpoint.exit_code == 0, checkpoint.output
    (tmp_path / "cp.json").write_text(checkpoint.stdout)
    blocking = await _finished(store, "t1", 1)
    later = await _finished(store, "t1", 1)
    # An outcome not settled: the run is finished but its step's outcome is unknown.
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE steps SET status = 'unknown' WHERE run_id = :r", {"r": blocking[0]}
        )
    )
    queued = await service_app.app.submit(store, "echo", {"text": "q"}, tenant_id="t1")

    got = await run_cli("prune", "--older-than", "0s", "--tenant", "t1", "--db", store_url)
    assert got.exit_code == 0, got.output
    assert "removed 3 runs" in got.output
    for run_id in old:
        assert set((await _rows_of(store, run_id)).values()) == {0}
    for run_id in (*blocking, *later, queued, *kept_other):
        assert (await _rows_of(store, run_id))["runs"] == 1
    assert (await _rows_of(store, blocking[0]))["steps"] > 0
    # A finished, settled run after the unsettled one waits until the prefix reaches it.
    assert (await _rows_of(store, later[0]))["events"] > 0

    ok = await run_cli("audit", "verify", "--db", store_url)
    assert ok.exit_code == 0, ok.output
    assert "intact" in ok.output and "records pruned" in ok.output
    assert "summary signed" in ok.output
    # A checkpoint taken before the prune is matched against the summary.
    since = await run_cli(
        "audit", "verify", "--db", store_url, "--since-checkpoint", str(tmp_path / "cp.json")
    )
    assert since.exit_code == 0, since.output


async def test_tampering_after_a_prune_is_still_found(
    keyed: None, store: Store, store_url: str
) -> None:
    await _finished(store, "t1", 2)
    kept = await _finished(store, "t1", 1)  # its outcome unsettled: it stays
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE steps SET status = 'unknown' WHERE run_id = :r", {"r": kept[0]}
        )
    )
    got = await run_cli("prune", "--older-than", "0s", "--db", store_url)
    assert got.exit_code == 0 and "removed 2 runs" in got.output, got.output
    assert (await run_cli("audit", "verify", "--db", store_url)).exit_code == 0

    # A record left after the pruned span, edited.
    await store.transact(
        lambda tx: tx.execute(
            "UPDATE events SET actor = 'mallory' WHERE run_id = :r", {"r": kept[0]}
        )
    )
    bad = await run_cli("audit", "verify", "--db", store_url)
    assert bad.exit_code == 1 and "TAMPERED" in bad.output
    # The summary forged without the key: fewer records claimed.
    await store.transact(lambda tx: tx.execute("UPDATE audit_pruned SET records = 1"))
    forged = await run_cli("audit", "verify", "--db", store_url)
    assert forged.exit_code == 1
    assert "summary does not match its signature" in forged.output
    # The summary deleted: the chain's first records are missing.
    await store.transact(lambda tx: tx.execute("DELETE FROM audit_pruned"))
    gone = await run_cli("audit", "verify", "--db", store_url)
    assert gone.exit_code == 1 and "TAMPERED" in gone.output


async def test_unsettled_work_is_never_prunable(store: Store) -> None:
    (run_id,) = await _finished(store, "t1", 1)
    policy = retention.Policy("t1", 0.0)
    cutoff = 1e12

    async def prunable() -> bool:
        found = await store.read(retention.prunable_runs, policy, cutoff, [run_id])
        return run_id in found

    assert await prunable()
    guards = [
        ("UPDATE steps SET status = 'started' WHERE run_id = :r",
         "UPDATE steps SET status = 'succeeded' WHERE run_id = :r"),
        ("INSERT INTO effects (key, run_id, step_no, status, updated_at) "
         "VALUES ('k', :r, 1, 'claimed', 0)", "DELETE FROM effects WHERE key = 'k'"),
        ("INSERT INTO outbox (key, run_id, step_no, tool, next_attempt_at, created_at, "
         "updated_at) VALUES ('o', :r, 1, 'mail', 0, 0, 0)", "DELETE FROM outbox WHERE key = 'o'"),
        ("INSERT INTO approvals (id, run_id, step_no, tool, required_role, requested_at, "
         "expires_at, default_decision) VALUES ('a', :r, 9, 'pay', 'guest', 0, 0, 'reject')",
         "DELETE FROM approvals WHERE id = 'a'"),
        ("UPDATE runs SET status = 'waiting' WHERE id = :r",
         "UPDATE runs SET status = 'completed' WHERE id = :r"),
        ("INSERT INTO events (run_id, seq, at, type, actor) VALUES (:r, 999, 0, 'x', 'y')",
         "DELETE FROM events WHERE seq = 999"),
    ]  # fmt: skip
    for block, unblock in guards:
        await store.transact(lambda tx, s=block: tx.execute(s, {"r": run_id}))
        assert not await prunable(), block
        await store.transact(lambda tx, s=unblock: tx.execute(s, {"r": run_id}))
        assert await prunable(), unblock
    # Too recent, or of a status not asked for.
    assert not await store.read(retention.prunable_runs, policy, 0.0, [run_id])
    failed_only = retention.Policy("t1", 0.0, ("failed",))
    assert not await store.read(retention.prunable_runs, failed_only, cutoff, [run_id])


async def test_dry_run_removes_nothing_and_says_what_would_go(store: Store, store_url: str) -> None:
    await _finished(store, "t1", 4)
    before = await _count(store, "SELECT COUNT(*) AS n FROM events")
    dry = await run_cli("prune", "--older-than", "0s", "--dry-run", "--json", "--db", store_url,
                        key=None)  # fmt: skip
    assert dry.exit_code == 0, dry.output
    (said,) = json.loads(dry.stdout)
    assert said["runs"] == 4 and said["records"] == before
    assert await _count(store, "SELECT COUNT(*) AS n FROM events") == before
    real = await run_cli("prune", "--older-than", "0s", "--json", "--db", store_url, key=None)
    (done,) = json.loads(real.stdout)
    assert done["runs"] == said["runs"] and done["rows"] == said["rows"]
    assert await _count(store, "SELECT COUNT(*) AS n FROM runs") == 0
    unsigned = await run_cli("audit", "verify", "--db", store_url, key=None)
    assert unsigned.exit_code == 0 and "records pruned" in unsigned.output


async def test_bad_input_is_refused_in_one_line(store: Store, store_url: str) -> None:
    for args, words in [
        (["--older-than", "ninety days"], "--older-than"),
        (["--older-than", "1d", "--status", "running"], "only finished runs"),
        ([], "no retention configured"),
        (["--unset-retention", "nobody"], "has no retention"),
    ]:
        got = await run_cli("prune", *args, "--db", store_url, key=None)
        said = got.output + str(got.exception)
        assert got.exit_code != 0 and words in said, (args, said)


async def test_a_worker_prunes_on_schedule_by_the_tenants_retention(
    store: Store, store_url: str
) -> None:
    old = await _finished(store, "t1", 2)
    other = await _finished(store, "t2", 1)
    got = await run_cli("prune", "--set-retention", "t1", "0s", "--db", store_url, key=None)
    assert got.exit_code == 0, got.output
    shown = await run_cli("prune", "--show-retention", "--db", store_url, key=None)
    assert "t1" in shown.output and "t2" not in shown.output
    worker = Worker(store, service_app.app, WorkerConfig(poll_seconds=0.05, prune_every=1))
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        for _ in range(600):  # until the positive signal: the runs are gone
            if not await _count(store, "SELECT COUNT(*) AS n FROM runs WHERE tenant_id = 't1'"):
                break
            await asyncio.sleep(0.05)
        for r in old:
            assert set((await _rows_of(store, r)).values()) == {0}
        assert (await _rows_of(store, other[0]))["runs"] == 1  # t2 has no retention
    finally:
        worker.stop()
        await task


async def test_a_worker_steps_while_a_prune_runs(store: Store, store_url: str) -> None:
    """A prune of many runs in small batches beside a worker stepping new runs: every
    new run completes and the chain verifies (the latency figure is bench's)."""
    await _finished(store, "t1", 30, steps=3)
    fresh = [
        await service_app.app.submit(store, "echo", {"text": "n", "steps": 5}, tenant_id="t1")
        for _ in range(5)
    ]
    worker = Worker(store, service_app.app, WorkerConfig(poll_seconds=0.02), burst=True)
    running = asyncio.create_task(worker.run(install_signals=False))
    from agentledger._prune import prune_tenant

    removed = await prune_tenant(store, retention.Policy("t1", 0.0), batch=20)
    await running
    assert removed.runs >= 30
    for r in fresh:
        assert (await store.get_run(r)) is None or (await store.get_run(r)).status == "completed"
    ok = await run_cli("audit", "verify", "--db", store_url, key=None)
    assert ok.exit_code == 0, ok.output
